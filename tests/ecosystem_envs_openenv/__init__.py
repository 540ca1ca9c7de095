"""Two small OpenEnv environments written on OpenEnv's own server classes (an
``Environment`` subclass served by ``create_app``), the fixtures of
tests/test_ecosystem_openenv.py: ``guess`` (a seeded guess-the-number game) and
``counter`` (echoes and counts; can sleep or raise on request). Each module's ``app``
is what ``uvicorn ecosystem_envs_openenv.<module>:app`` serves."""
