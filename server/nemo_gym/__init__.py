"""NeMo Gym's resources-server protocol over patchgym's sessions: the routes (:mod:`.routes`), their
bodies (:mod:`.bodies`), outcomes (:mod:`.outcome`) and aggregate (:mod:`.metrics`), dataset rows
(:mod:`.dataset`), and the server directory NeMo Gym's launcher runs (:mod:`.setup`, :mod:`.launcher`)."""
