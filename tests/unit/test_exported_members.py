"""The public API is exactly what receiver/__init__.py exports, sorted."""

import receiver


def test_all_is_complete_and_sorted() -> None:
    public = {
        name
        for name, value in vars(receiver).items()
        if not name.startswith("_") and getattr(value, "__module__", "").startswith("receiver.")
    }
    assert public <= set(receiver.__all__)
    assert set(receiver.__all__) <= set(vars(receiver))


def test_every_export_comes_from_a_private_module() -> None:
    for name in receiver.__all__:
        module = getattr(getattr(receiver, name), "__module__", "receiver._")
        assert module.startswith("receiver._"), (name, module)
