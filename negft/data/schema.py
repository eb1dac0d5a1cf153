"""The shard schema and the NegBench CSV layouts: the one place their field names live (and how a list
cell of those CSVs is read).

Shard samples are webdataset records: an image (``png`` or ``jpg``) and a ``json`` holding the
fields below. Names follow the NegBench release so its CSVs convert without loss.
"""

IMAGE_KEYS = ("png", "jpg", "jpeg")
NEGATIVE_IMAGE_KEYS = ("neg.png", "neg.jpg", "neg.jpeg")   # RelComp: the hard negative image, when there is one

# json fields of a shard sample
CAPTION = "caption"          # str: the original affirmative caption
NEGCAP = "negcap"            # list[str]: captions that negate objects absent from the image (NegCap)
MCQ = "mcq"                  # dict: {options: [4 str], answer: int, answer_template, option_templates}
OBJECTS = "objects"          # dict: {positive: [str], negative: [str]}
RELCOMP = "relcomp"          # dict: {caption, negatives: [{text, kind}], negative_image: its kind or null,
#                              negative_image_caption: str, negative_image_negatives: [str]} (the last two where a
#                              negative image is: TripletCLIP's T⁻ of I⁻, NegCLIP's hard image's captions)
RELCOMP_NEGATIVE_KINDS = ("attribute", "predicate", "exchange")   # selective negatives of a RelComp caption
MAX_NEGATIVES = 4      # hard negatives per RelComp caption (CE-CLIP's four types); batches pad to this many and
#                        carry a mask
# CE-CLIP's hard-negative types (its COCO data's relation, adjective, noun and verb swaps), in its order: the kinds
# of a converted ceclip-coco record, and the thresholds CECLIPLoss keeps one of per type
CECLIP_TYPES = ("relation", "adjective", "noun", "verb")
SCENE = "scene"              # dict: the embedded world's full annotation (world data only)
# not a json field: where the data pipeline records, in the json it hands the loss terms' batch fields, the NegCap
# caption it drew for the step (json keys are strings: a tuple cannot collide with a sample's own field)
DRAWN_NEGCAP = ("negft", "drawn negcap")
# ... and, for a relcomp stream whose terms read fields, the indices of the hard captions it drew for the step: one
# of ``negatives`` and one of ``negative_image_negatives``
DRAWN_NEGATIVES = ("negft", "drawn negatives")

MCQ_TEMPLATES = ("positive", "negative", "hybrid")           # NegBench's names
TEMPLATE_NAMES = {"positive": "affirmation", "negative": "negation", "hybrid": "hybrid"}
N_OPTIONS = 4

# NegBench evaluation CSVs
MCQ_CSV_COLUMNS = ("correct_answer", "caption_0", "caption_1", "caption_2", "caption_3",
                   "correct_answer_template", "image_path")
RETRIEVAL_CSV_COLUMNS = ("filepath", "captions")             # captions: a python/json list of str
NEGCAP_CSV_COLUMNS = ("filepath", "caption", "extracted_objects", "negative_objects",
                      "negative_captions")
ZEROSHOT_CSV_COLUMNS = ("filepath", "label")                  # label: class index into classes.json
# RelComp probe pairs (Winoground-style): caption_k is true of image_k and false of the other image
RELCOMP_CSV_COLUMNS = ("image_0", "image_1", "caption_0", "caption_1", "kind")
# the world's Probe-C pairs: an attribute swapped for its antonym, or the object swapped for another
PROBE_C_KINDS = ("composition", "object")
PROBE_B_FILLERS = ("black", "gray", "noise", "scene")     # Probe-B's fillers (the release names its folders so)


def literal_cell(cell: str):
    """A CSV cell holding a list: JSON, or the Python literal pandas writes for ``str(list)`` (single quotes), read
    with ``ast.literal_eval`` (never ``eval``). ValueError where it parses as neither."""
    import ast
    import json
    try:
        return json.loads(cell)
    except ValueError:
        try:
            return ast.literal_eval(cell)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            raise ValueError(f"not a list: {cell[:80]!r}") from None


def list_cell(cell: str) -> list[str]:
    """A list cell of a NegBench CSV (``literal_cell``). ValueError unless it is a list of strings."""
    value = literal_cell(cell)
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"not a list of strings: {cell[:80]!r}")
    return list(value)
