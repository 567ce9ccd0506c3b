"""A fix against its release sources: the release check (check) and its per-part proofs (proof),
the rebase classifier (rebase), the change a fix makes (changes, `fixpack show`) and writing a fix
(authoring, `fixpack edit` / `commit`); what a fix's tests run in (release_tree, pytest_plugin)."""
