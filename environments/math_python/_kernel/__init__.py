"""The sandboxed side of a MathPython kernel: the processes that run the model's code.

Stdlib only, and nothing of this project: the zygote (``../_kernel_driver.py``, run as
``python -I _kernel_driver.py FD``) puts ``environments/math_python`` on ``sys.path``,
imports this package as the top-level package ``_kernel``, takes the path off again and
then hides the project. Every module here is therefore imported once, at zygote start,
before any fork; the kernels (forked children) import nothing of it later, and the
modules import each other relatively, so that the host can import them too (as
``environments.math_python._kernel``), for :data:`MECHANISMS` or a test.

One module per mechanism, each saying what it bounds and how:

=================  ===================================================================
``libc``           ctypes calls the ``os`` module lacks (mount, unshare, prctl) and flags
``channel``        frames on pipes (4-byte big-endian length + UTF-8 JSON), ``poll``,
                   closing inherited descriptors
``root``           what the kernel sees of the filesystem: the zygote's read-only root,
                   the kernel's private ``/tmp`` and the stacked root
``cgroups``        the per-kernel memory cgroups (v1 or v2) and their OOM-kill counter
``ipc_limits``     the sysctls of a kernel's private IPC namespace
``seccomp``        the executor's BPF filter (memfd, new namespaces, SysV IPC)
``rlimits``        the executor's rlimits and OOM score
``executor``       the model's interpreter: runs cells, speaks to the supervisor
``relay``          the supervisor's loop: relays host requests, captures output
``supervisor``     a forked kernel's set-up: namespaces, the executor, then the relay
=================  ===================================================================
"""

#: mechanisms a ForkServer may be told to leave off (to test the fallbacks)
MECHANISMS = ("memory_cgroup", "cpu_cgroup", "seccomp", "ipc_limits", "stacked_root")
