"""MSR-VTT videos read as released (negft.probes.video): .mp4 files the tests write with PyAV (solid-colour frames,
H.264 with B-frames, so that decoding order differs from presentation order), in NegBench's MSR-VTT CSV layout
(``msr_vtt_retrieval.csv``: filepath, captions; ``msr_vtt_mcq_rephrased_llama.csv``: ..., image_path). The frames
picked are NegBench's ``UniformFrameSampler``'s, computed here from its formula; a stand-in image tower whose
features are a frame's mean colour shows which frames were encoded."""
import csv
from pathlib import Path

import av
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from torchvision.transforms import ToTensor

from negft.probes import video
from negft.probes.base import Dataset, EvalContext

COLOURS = [(255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 0), (255, 0, 255), (0, 255, 255), (255, 255, 255),
           (128, 128, 128), (255, 128, 0), (0, 128, 255), (128, 0, 255), (128, 255, 0), (255, 0, 128)]
MCQ_COLUMNS = ["correct_answer", "caption_0", "caption_1", "caption_2", "caption_3", "correct_answer_template",
               "image_path"]


def write_video(path: Path, colours, size=32):
    """An .mp4 of one solid-colour frame per colour, 10 fps: H.264 (libx264, 3 B-frames) as MSR-VTT's videos are
    coded, or MPEG-4 Part 2 where this PyAV has no libx264."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w") as container:
        if "libx264" in av.codecs_available:
            stream = container.add_stream("libx264", rate=10,
                                          options={"x264-params": "bframes=3:b-adapt=0:scenecut=0"})
        else:
            stream = container.add_stream("mpeg4", rate=10)
        stream.width = stream.height = size
        stream.pix_fmt = "yuv420p"
        for colour in colours:
            frame = av.VideoFrame.from_ndarray(np.full((size, size, 3), colour, np.uint8), format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def expected_indices(n: int, max_frames: int = 4) -> list[int]:
    """NegBench's UniformFrameSampler(max_frames)(0, n − 1): ticks = torch.linspace(0, n − 1, m + 1, dtype=int),
    i.e. k(n − 1)/m truncated, m = min(max_frames, n); each pick torch.round of the ticks' midpoint, half to even
    (Python's round)."""
    m = min(max_frames, n)
    ticks = [k * (n - 1) // m for k in range(m + 1)]
    return [round((a + b) / 2) for a, b in zip(ticks, ticks[1:])]


def decoded_frames(path: Path) -> list[np.ndarray]:
    """Every frame of the video in presentation order, decoded from the start (RGB24)."""
    with av.open(str(path)) as container:
        return [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]


class MeanColour(torch.nn.Module):
    """A stand-in image tower: a frame's features are its mean colour (0..1, from ToTensor)."""

    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(1))

    def encode_image(self, x):
        return x.mean((2, 3)) * self.scale


def colour_ctx(texts=None) -> EvalContext:
    ctx = EvalContext(MeanColour(), ToTensor(), None, "cpu", n_boot=20)
    ctx._texts.update(texts or {})
    return ctx


def frame_feature(frame: np.ndarray) -> torch.Tensor:
    return F.normalize(torch.from_numpy(frame).float().mean((0, 1)) / 255, dim=0)


def write_csv(path: Path, columns, rows):
    """As pandas' to_csv writes NegBench's files (index=False; lists as str(list))."""
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        writer.writerows(rows)


def msrvtt(root: Path) -> Dataset:
    return Dataset("msrvtt", root, "negbench_msrvtt")


@pytest.mark.parametrize("n", [1, 2, 3, 5, 10, 13])
def test_picked_frames_are_negbench_samplers_decoded_in_presentation_order(tmp_path, n):
    path = write_video(tmp_path / f"video{n}.mp4", COLOURS[:n])
    keys = video.frames(str(path), {"frames": 4}, tmp_path)
    assert keys == [f"{path}#frame={i}" for i in expected_indices(n)]
    every = decoded_frames(path)
    assert len(every) == n
    for key, i in zip(keys, expected_indices(n)):
        frame = np.asarray(video.open_frame(key))
        assert np.array_equal(frame, every[i])
        nearest = np.argmin([np.abs(frame.reshape(-1, 3).mean(0) - c).sum() for c in COLOURS[:n]])
        assert nearest == i                                  # the frame written i-th, not the i-th decoded


def test_video_features_are_the_mean_of_its_picked_frames_and_each_video_is_decoded_once(tmp_path, monkeypatch):
    """msr_vtt_retrieval.csv naming two .mp4 files (relative to the set's folder): a video's features are the
    normalised mean of its picked frames' normalised features; each video is decoded once for its 4 frames, and
    a second probe on the same context encodes nothing again."""
    from negft.probes.retrieval import load, run_retrieval
    videos = tmp_path / "videos"
    colours = {"video7010.mp4": COLOURS[:10], "video7011.mp4": COLOURS[6:13]}
    lengths = {name: len(c) for name, c in colours.items()}
    for name, c in colours.items():
        write_video(videos / name, c)
    write_csv(videos / "msr_vtt_retrieval.csv", ["filepath", "captions"],
              [[name, str([f"caption of {name}"])] for name in lengths])
    expected = {}
    for name, n in lengths.items():
        every = decoded_frames(videos / name)
        expected[name] = F.normalize(torch.stack([frame_feature(every[i]) for i in expected_indices(n)]).mean(0),
                                     dim=0)
    decodes = []
    real_decode = video.decode
    monkeypatch.setattr(video, "decode", lambda path, wanted: decodes.append(path) or real_decode(path, wanted))
    ctx = colour_ctx({f"caption of {name}": expected[name] for name in lengths})
    ds = msrvtt(videos)
    rows = load(ds, "retrieval")["rows"]
    feats = video.encode_visual(ctx, ds, [r["visual"] for r in rows])
    for r, f in zip(rows, feats):
        assert torch.allclose(f, expected[r["filepath"]], atol=1e-6)
    assert sorted(decodes) == sorted(str(videos / name) for name in lengths)
    res = run_retrieval(ctx, ds)
    assert res.metrics["retrieval/msrvtt/r1"] == 1.0 and not res.skipped
    assert len(decodes) == 2                                 # the image cache held every frame


def test_unreadable_videos_are_skipped_by_reason_and_the_mp4_comes_before_extracted_frames(tmp_path, monkeypatch):
    """msr_vtt_mcq_rephrased_llama.csv rows: a good video that also has frames extracted beside it (the .mp4 is
    read), garbage bytes named .mp4 (skipped), garbage with frames extracted beside it (the frames are read), an
    .mp4 with no video frames, and a relative path to no file (the reason says where it was looked for)."""
    from negft.probes.mcq_neg import run
    videos = tmp_path / "videos"
    good = write_video(videos / "video1.mp4", COLOURS[:10])
    (videos / "video1").mkdir()
    Image.new("RGB", (32, 32), COLOURS[12]).save(videos / "video1" / "00001.png")    # a colour the .mp4 lacks
    (videos / "video2.mp4").write_bytes(b"not a video at all\x00" * 64)
    (videos / "video3.mp4").write_bytes(b"garbage again\x00" * 64)
    (videos / "video3").mkdir()
    Image.new("RGB", (32, 32), COLOURS[12]).save(videos / "video3" / "00001.png")
    with av.open(str(videos / "video4.mp4"), "w") as container:                 # a header, no frames
        stream = container.add_stream("mpeg4", rate=10)
        stream.width = stream.height = 32
        container.start_encoding()
    opts = ["o0", "o1", "o2", "o3"]
    write_csv(videos / "msr_vtt_mcq_rephrased_llama.csv", MCQ_COLUMNS,
              [[0, *opts, "positive", f"video{k}.mp4"] for k in (1, 2, 3, 4, 404)])
    ds = msrvtt(videos)
    items = video.locate(ds, [f"video{k}.mp4" for k in (1, 2, 3, 4, 404)])
    assert items[0] == [f"{good}#frame={i}" for i in expected_indices(10)]
    assert items[1] == "video file not decodable by FFmpeg"
    assert items[2] == [str(videos / "video3" / "00001.png")]
    assert items[3] == "video file has no video frames"
    assert items[4] == ("video file not found, nor frames extracted from it (relative paths are read under "
                        f"{videos}, not the working directory as NegBench's loader reads them)")
    ctx = colour_ctx({o: F.normalize(torch.tensor([1.0, 0, 0]), dim=0) for o in opts})
    res = run(ctx, ds)
    assert res.metrics["mcq_neg/msrvtt/skipped_rows"] == 3
    why = res.skipped["mcq_neg/msrvtt/rows"]
    assert "3 of 5 rows" in why and "video file not decodable by FFmpeg: 1" in why
    assert "video file has no video frames: 1" in why and "video file not found, nor frames extracted" in why
    # a frame that fails to decode when encoded: the row is skipped with that reason, the others are scored
    video._DECODED.clear()

    def broken(path, wanted):
        raise video.VideoError(f"{path}: damaged")
    monkeypatch.setattr(video, "decode", broken)
    res = run(colour_ctx(ctx._texts), ds)
    assert "video frames not decodable by FFmpeg: 1" in res.skipped["mcq_neg/msrvtt/rows"]
    assert res.metrics["mcq_neg/msrvtt/skipped_rows"] == 4


def test_a_relative_image_path_not_found_says_where_it_was_looked_for(tmp_path):
    """An image set (COCO_val_retrieval.csv) naming one relative and one absolute path to no file: the relative
    one's reason names the set's folder, under which negft reads it (NegBench: the working directory)."""
    from negft.probes.retrieval import run_retrieval
    Image.new("RGB", (32, 32), COLOURS[0]).save(tmp_path / "here.png")
    write_csv(tmp_path / "COCO_val_retrieval.csv", ["filepath", "captions"],
              [["here.png", "['red']"], ["val2014/gone.jpg", "['gone']"],
               [str(tmp_path.parent / "elsewhere.jpg"), "['elsewhere']"]])
    ctx = colour_ctx({"red": F.normalize(torch.tensor([1.0, 0, 0]), dim=0)})
    res = run_retrieval(ctx, Dataset("coco", tmp_path, "negbench_coco"))
    why = res.skipped["retrieval/coco/rows"]
    assert (f"image file not found (relative paths are read under {tmp_path}, not the working directory as "
            "NegBench's loader reads them): 1") in why
    assert "image file not found: 1" in why                  # the absolute path, read as it is
    assert res.metrics["retrieval/coco/r1"] == 1.0
