"""A model evaluated on tasks: a chat client for any OpenAI-compatible endpoint (:mod:`.model`), the
episode loop that drives ``RepoEnv`` with its tool calls (:mod:`.loop`), a whole run written to a
run directory that resumes (:mod:`.run`), its HTML report (:mod:`.html_report`) and exports of its
trajectories as training data (:mod:`.export`). It sits on the environments; the server's
``/v1/rollouts`` and ``patchgym run`` sit on it."""
