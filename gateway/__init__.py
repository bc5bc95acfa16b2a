"""The gateway: the client-facing API. ``rounds`` runs the draft -> verify loop, ``clients`` talks to
the drafter and the verifier, ``api`` is the client-facing servicer, ``stats`` the per-request figures."""
