"""verifiers envs written as Environments Hub packages write them (a module with
``load_environment(**kwargs)``), on the real classic verifiers classes, for
tests/test_ecosystem_verifiers.py (loaded as ``verifiers:ecosystem_envs_verifiers.<module>``)."""
