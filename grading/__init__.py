"""How a patch is graded: the one patch parser (:mod:`.patches`) and applier (:mod:`.patch_apply`),
test runs through patchgym's pytest runtime (:mod:`.testrun`, :mod:`.runners`,
:mod:`.pytest_runtime`) with tamper checks (:mod:`.integrity`), SWE-bench's grading rules
(:mod:`.outcome`), the verifier that ties them together (:mod:`.verifier`), and grading many
predictions at once (:mod:`.evaluation`, :mod:`.parallel`)."""
