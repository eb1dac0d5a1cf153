"""The keys of the converters ``negft data`` runs (``negft/convert/``): one typed dataclass per converter, as every
command has one, so that ``negft data convert X --help`` lists them with their defaults and a bad value is refused
before anything is read. Each class's fields are its function's parameters in their order, with the same
defaults (``tests/test_convert_keys.py`` holds the two together); the required ones may be given as bare words.
A class declares only its own keys: ``shards_keys`` adds the ones every shard-writing converter takes (out,
maxcount, progress) and fills in the ``SHARED`` ones it names. This module imports no converter: ``--help`` stays
fast."""
from __future__ import annotations

from dataclasses import MISSING, Field, dataclass, field
from typing import Optional

from negft.commands.keys import key
from negft.fields import bounded, choice

MAXCOUNT_DOC = "samples per shard"
PROGRESS_DOC = "false: no progress bar"
OUT_DOC = "a new folder for the shards and manifest.json (never over a converted one)"


def seed() -> int:
    return bounded(0, lo=0, doc="the seed of every random draw: the same seed, the same output")


def column(default: str, what: str) -> str:
    return key(default, f"the CSV column of {what}")


# keys several converters share, word for word: a class names one with its type alone (``sep: str``)
SHARED = {"images": (MISSING, "the folder its image paths are under"),
          "prefix": ("", "the leading part of the CSV's absolute image paths that images= replaces"),
          "caption_key": ("caption", "the CSV column of the caption"),
          "negcap_key": ("negative_captions", "the CSV column of the negated captions"),
          "positive_key": ("extracted_objects", "the CSV column of the objects present"),
          "negative_key": ("negative_objects", "the CSV column of the objects absent"),
          "sep": (",", "the CSV's separator (tab: \\t)")}


def _required(value) -> bool:
    return isinstance(value, Field) and value.default is MISSING and value.default_factory is MISSING


def shards_keys(cls=None, *, out: str = OUT_DOC, progress: bool = True):
    """The keys of a converter that writes shards: the class declares its own and names the ``SHARED`` ones it
    takes; ``out`` follows its required ones, ``maxcount`` (and ``progress``) close the list, the order every such
    converter's parameters have."""
    def build(cls):
        own = cls.__dict__.get("__annotations__", {})
        for name in own:
            if name in SHARED and name not in cls.__dict__:
                setattr(cls, name, key(*SHARED[name]))
        required = [name for name in own if name not in cls.__dict__ or _required(cls.__dict__[name])]
        common = {"out": ("str", key(doc=out)), "maxcount": ("int", bounded(1000, lo=1, doc=MAXCOUNT_DOC))}
        if progress:
            common["progress"] = ("bool", key(True, PROGRESS_DOC))
        order = [*required, "out", *(n for n in own if n not in required), *list(common)[1:]]
        cls.__annotations__ = {name: own[name] if name in own else common[name][0] for name in order}
        for name, (_, default) in common.items():
            setattr(cls, name, default)
        return dataclass(kw_only=True)(cls)
    return build if cls is None else build(cls)


@shards_keys(progress=False)
class NegbenchNegcapKeys:
    """NegBench's CC12M-NegCap CSV (and, with mcq=, the NegMCQ CSV of the same images) with their images -> shards."""
    csv: str = key(doc="the NegCap CSV, or a glob of them")
    images: str
    mcq: str = key("", "the NegMCQ CSV of the same images: its questions join the same samples")
    prefix: str
    img_key: str = column("filepath", "the image path")
    caption_key: str
    negcap_key: str
    positive_key: str
    negative_key: str
    mcq_img_key: str = key("image_path", "the MCQ CSV's column of the image path")
    sep: str


@shards_keys(progress=False)
class NegbenchMcqKeys:
    """NegBench's CC12M-NegMCQ CSV with its images -> shards of mcq samples."""
    csv: str = key(doc="the NegMCQ CSV, or a glob of them (the release has one per job)")
    images: str
    prefix: str
    img_key: str = column("image_path", "the image path")
    answer_key: str = column("correct_answer", "the right option's index")
    options_key: str = key("caption_0,caption_1,caption_2,caption_3", "the CSV columns of the options, comma list")
    template_key: str = column("correct_answer_template", "the right answer's template")
    caption_key: str = column("caption", "the caption (read where the file has it)")
    sep: str


@shards_keys(progress=False)
class Img2datasetKeys:
    """An img2dataset download of NegBench's images with its NegCap or NegMCQ CSV -> shards."""
    folder: str = key(doc="img2dataset's output folder (its webdataset or files layout)")
    annotations: str = key(doc="the NegCap or NegMCQ CSV the images belong to")
    kind: str = choice("auto", ("auto", "negcap", "mcq"), doc="what annotations= holds; auto: read off its columns")
    join: str = choice("auto", ("auto", "url", "key"), doc="how an image finds its row: by url or by key")
    mcq: str = key("", "a NegMCQ CSV of the same images: its questions join the same samples")
    img_key: str = key("", "the CSV column of the image's key (join=key)")
    url_key: str = column("url", "the image's URL (join=url)")
    caption_key: str
    negcap_key: str
    positive_key: str
    negative_key: str
    sep: str


@shards_keys
class CocoKeys:
    """COCO captions (and instances: the objects present) with the split's images -> shards."""
    captions: str = key(doc="COCO's captions_*.json")
    instances: str = key(doc="COCO's instances_*.json (the objects present), or \"\" for none")
    images: str = key(doc="the folder of the split's images")


@dataclass(kw_only=True)
class CcnegKeys:
    """CC-Neg's evaluation file -> the JSON the ccneg probe reads."""
    pt: str = key(doc="CC-Neg's evaluation torch file (read with weights_only=False: only a file you trust)")
    out: str = key(doc="a new JSON file the ccneg probe reads")


@shards_keys
class NegclipCocoKeys:
    """NegCLIP's train_neg_clip.tsv with COCO's images -> shards with hard captions and a hard image."""
    tsv: str = key(doc="NegCLIP's train_neg_clip.tsv")
    images: str = key(doc="the folder its filepath column's coco/train2014/... is under")
    prefix: str = key("", "the leading part of the TSV's image paths that images= replaces")


@shards_keys
class NegationclipCocoKeys:
    """NegationCLIP's captions JSON with COCO train2014 -> shards."""
    captions: str = key(doc="NegationCLIP's captions JSON")
    images: str = key(doc="COCO's train2014 folder")
    val_split: float = bounded(0.2, lo=0.0, doc="the fraction of rows the reference validates on, left out, below 1 "
                                                "(0: every row)")


@shards_keys
class CcnegTrainKeys:
    """CC-Neg's fine-tuning rows with their distractor images -> shards."""
    pt: str = key(doc="CC-Neg's ccneg_preprocessed.pt (read with weights_only=False: only a file you trust)")
    coco_captions: str = key(doc="COCO's captions_train2017.json (the distractors' captions)")
    coco_images: str = key(doc="its train2017/ folder")
    mapping: str = key("", "distractor_image_mapping.pt; empty: the one beside pt=")
    root: str = key("", "the folder the release's image paths are under; empty: pt='s folder")


@shards_keys
class TripletclipDataKeys:
    """TripletCLIP's webdataset shards -> negft's shards."""
    folder: str = key(doc="TripletCLIP's shard-<n>.tar files (its loader's --data_dir)")


@shards_keys
class CeclipCocoKeys:
    """CE-CLIP's generated COCO data with its images -> shards with typed hard captions."""
    npy: str = key(doc="CE-CLIP's generated_data/coco_train/ (or one of its .npy files)")
    images: str = key(doc="the folder holding train2014/")


@shards_keys(out="a new folder for train/ and val/ shards")
class NegateKeys:
    """Captioned images with object labels -> NegCap and NegMCQ shards (train/ and val/)."""
    captions: str = key(doc="a captions file: COCO's captions JSON or a CSV (filepath, caption)")
    images: str = key(doc="the folder of the images")
    labels: str = key("", "the objects present: COCO's instances JSON or a CSV (filepath, objects)")
    seed: int = seed()
    val_fraction: float = bounded(0.05, lo=0.0, hi=1.0, doc="the share of images drawn into val/")
    negatives: int = bounded(3, lo=1, doc="absent objects drawn per image")
    smoothing: float = bounded(1.0, lo=0.0, doc="the co-occurrence model's additive smoothing")


@shards_keys
class RelcompKeys:
    """Visual Genome's relationships and images -> RelComp shards."""
    relationships: str = key(doc="Visual Genome's relationships.json")
    images: str = key(doc="VG's root holding VG_100K/ and VG_100K_2/")
    attributes: str = key("", "attributes.json; empty: the one beside relationships=; none: build without")
    image_data: str = key("", "image_data.json; empty: the one beside relationships=, if there")
    exclude: str = key("", "files of image ids to leave out (an evaluation's), comma-separated")
    seed: int = seed()
    max_per_image: int = bounded(1, lo=1, doc="samples drawn per image")


@shards_keys
class NegativesKeys:
    """Hard captions by a method (NegCLIP's, FSC-CLIP's, CE-CLIP's) for every captioned sample of shards."""
    method: str = field(metadata={"choices": ("negclip", "fscclip", "ceclip"), "doc": "whose hard captions to make"})
    shards: str = key(doc="the captioned shards: a folder of them or a brace list")
    tagger: str = choice("world", ("world", "spacy"), doc="world: the world's vocabulary; spacy: spacy_model=")
    spacy_model: str = key("en_core_web_sm", "the spaCy model tagger=spacy loads (installed beforehand)")
    seed: int = seed()
    per_caption: Optional[int] = bounded(None, lo=1, doc="at most this many per caption; empty: the method's")


@shards_keys(out="a new folder, not the one holding the shards")
class HardImagesKeys:
    """Each sample of shards with a nearest-neighbour hard image, by an open_clip model's features."""
    shards: str = key(doc="the shards to add hard images to: a folder of them or a brace list")
    model: str = key("ViT-B-32", "the open_clip architecture whose image features find the neighbours")
    pretrained: str = key("openai", "its weights: a tag in the local cache, a file or local-dir:DIR")
    k: int = bounded(3, lo=1, doc="nearest images one is drawn from")
    batch: int = bounded(64, lo=1, doc="images per forward pass")
    device: str = key("cpu", "cpu, cuda or cuda:N")
    seed: int = seed()


# `negft data SUB ...` -> (the converter, module:function under negft/convert/, its keys)
CONVERTERS = {
    "convert negbench-negcap": ("negft.convert.negbench:convert_negcap", NegbenchNegcapKeys),
    "convert negbench-mcq": ("negft.convert.negbench:convert_mcq", NegbenchMcqKeys),
    "convert img2dataset": ("negft.convert.img2dataset:convert", Img2datasetKeys),
    "convert coco": ("negft.convert.coco:convert", CocoKeys),
    "convert ccneg": ("negft.convert.ccneg:convert", CcnegKeys),
    "convert negclip-coco": ("negft.convert.negclip_coco:convert", NegclipCocoKeys),
    "convert negationclip-coco": ("negft.convert.negationclip_coco:convert", NegationclipCocoKeys),
    "convert ccneg-train": ("negft.convert.ccneg_train:convert", CcnegTrainKeys),
    "convert tripletclip-data": ("negft.convert.tripletclip_data:convert", TripletclipDataKeys),
    "convert ceclip-coco": ("negft.convert.ceclip_coco:convert", CeclipCocoKeys),
    "negate": ("negft.convert.negate:negate", NegateKeys),
    "relcomp": ("negft.convert.relcomp_vg:relcomp", RelcompKeys),
    "negatives": ("negft.convert.negatives:negatives", NegativesKeys),
    "hard-images": ("negft.convert.hard_images:hard_images", HardImagesKeys),
}
