"""Making tasks: registered repositories (:mod:`.registry`, read by :mod:`.git_source`), their
environments (:mod:`.repo_setup`), tasks mined from history (:mod:`.mining`) or synthesized by
mutation (:mod:`.synth`), and the validation every new task must pass (:mod:`.validation`). It uses
grading; nothing below uses it."""
