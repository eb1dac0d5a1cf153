"""Which tower a name of an open_clip model belongs to: the one place that reads open_clip's naming (``visual.*``
the image tower, ``logit_*`` shared, everything else the text tower)."""


def tower_of(name: str) -> str:
    """The tower of a parameter, buffer or child name: 'v' visual, 'shared' (logit_scale / logit_bias), 't' text."""
    root = name.split(".", 1)[0]
    return "v" if root == "visual" else "shared" if root.startswith("logit_") else "t"
