"""KERNELS.md is what the manifest generator reads: every kernel in the sources is documented
with the same parameter kinds, and every documented kernel exists."""

from cuda_kernel_docs import documented, in_sources


def test_every_kernel_is_documented_with_its_signature():
    docs, srcs = documented(), in_sources()
    assert srcs, "no extern \"C\" kernels found"
    assert sorted(docs) == sorted(srcs)
    for entry, (module, kinds) in srcs.items():
        assert docs[entry] == (module, kinds), entry


def test_pointers_come_first():
    for entry, (_, kinds) in in_sources().items():
        n_ptr = kinds.count("ptr")
        assert kinds[:n_ptr] == ("ptr",) * n_ptr, f"{entry}: pointer params must come first"
