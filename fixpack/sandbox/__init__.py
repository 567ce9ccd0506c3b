"""A fix's own process: the runner (job in, bytes out), the fork server and the worker, and what
confines the worker (privilege, limits, landlock, seccomp) and checks it afterwards (watch)."""
