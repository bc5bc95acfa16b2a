"""Which drafter nodes `tandem up` tells the gateway share the verifier's cores (``--drafter-shares-cpus``:
no drafting ahead, drafted tokens priced per session they delay)."""

from tandem.affinity import cores_shared
from tandem.up import drafter_computes


def test_a_model_drafter_on_the_verifiers_cores_is_flagged_and_the_suffix_node_is_not():
    assert cores_shared(None, "1") and cores_shared("0-1", "1") and not cores_shared("0", "1")
    assert drafter_computes("default", lookup_only=False)
    assert drafter_computes("/models/my-drafter", lookup_only=False)
    assert not drafter_computes("suffix", lookup_only=False)      # a table lookup: drafting ahead costs nothing
    assert not drafter_computes("default", lookup_only=True)      # no drafter node at all
