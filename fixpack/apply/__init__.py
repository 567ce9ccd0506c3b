"""Applying a selection to an image: the driver (engine), its all-or-nothing commits (journal), the
records and the state folder beside the targets (state, store, locations), writes through folder
descriptors (dirfd), the target folders (targets), hashing, verify and the container-start check
(fastpath).

Imported by the container-start check before anything else: this file imports nothing."""
