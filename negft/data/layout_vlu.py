"""Where the VLU ("Is BERT blind?") files sit under one dataset root: a checkout of the
paper's repository (TAU-VAILab/isbertblind) with the concreteness ratings beside it. The reader
(negft/probes/vlu.py) and the world's writer (negft/world/formats/vlu.py) take their paths from here.

- ``datasets/shape_association.csv`` (ShapeIt, as released: columns ``word, gt, options``, options a Python
  list literal such as ``"['triangle', 'rectangle', 'circle']"``) and ``datasets/shape_association_adj.csv`` (the
  adjective variant: triangular / rectangular / circular); their prompts in ``configs/shapes.json`` /
  ``configs/shapes_adj.json`` (``{"setup_params": {..., "task": "choice"}, "prompts": [...]}``, ``MASK`` the slot,
  ``WORD`` the item), the layout of the repository's ``run_on_dataset.py`` "choice" task.
- ``datasets/color_association.csv``: colour associations (CTD / NCD lists) in that same "choice" layout, with
  optional ``configs/colors.json``. The paper's repository does not ship them (it links CTD on Kaggle and NCD on
  Google Drive, whose own file layouts could not be confirmed here), so they are converted to the repository's
  own choice-task layout.
- ``Concreteness_ratings_Brysbaert_et_al_BRM.txt``: Brysbaert et al. (2014) as published (tab-separated;
  columns ``Word, Bigram, Conc.M, Conc.SD, Unknown, Total, Percent_known, SUBTLEX, Dom_Pos``), the file the
  paper's repository links (ArtsEngine/concreteness).
"""
from __future__ import annotations

SHAPE_CSV = "datasets/shape_association.csv"
SHAPE_ADJ_CSV = "datasets/shape_association_adj.csv"
COLOR_CSV = "datasets/color_association.csv"
SHAPE_CONFIG = "configs/shapes.json"
SHAPE_ADJ_CONFIG = "configs/shapes_adj.json"
COLOR_CONFIG = "configs/colors.json"
CONCRETENESS = "Concreteness_ratings_Brysbaert_et_al_BRM.txt"
CHOICE_COLUMNS = ("word", "gt", "options")
CONCRETENESS_COLUMNS = ("Word", "Bigram", "Conc.M", "Conc.SD", "Unknown", "Total", "Percent_known", "SUBTLEX",
                        "Dom_Pos")
# the slot and item markers of the repository's prompts (utils/setup_utils.py: prompt.replace("WORD", word)
# .replace("MASK", option))
MASK, WORD = "MASK", "WORD"
