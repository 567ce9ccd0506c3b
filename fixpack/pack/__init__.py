"""The pack model: fixes, profiles and ports read and validated (pack, schema, paths), the lock
(lockfile), port switches and hooks (switches, ports) and serving recipes (recipe)."""
