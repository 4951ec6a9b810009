"""A study writes only over its own files (issue 15): a user's ptq.json, ptq.md, ptq.csv or PNG of the
same name in --out is refused in one line and left as it was; the study's own files are replaced."""

from __future__ import annotations

from pathlib import Path

import pytest

from quarl_edge.common.figures import save_png
from quarl_edge.runtimes.errors import InputError
from quarl_edge.study._common import write_tables

HEADER = ("policy", "variant")
STUDY = {"format": "quarl-edge/study-ptq", "results": []}


def _write(out: Path) -> list[Path]:
    return write_tables(out, "ptq", STUDY, "# PTQ study (quick suite)\n", HEADER, [["a", "fp32"]])


@pytest.mark.parametrize(("name", "content"), [("ptq.json", '{"my": "data"}'), ("ptq.md", "# my notes\n"),
                                               ("ptq.csv", "date,weight\n1,2\n")])  # fmt: skip
def test_a_users_file_of_the_same_name_is_refused_and_kept(tmp_path: Path, name: str, content: str) -> None:
    (tmp_path / name).write_text(content)
    with pytest.raises(InputError, match="not") as e:
        _write(tmp_path)
    assert "\n" not in str(e.value) and (tmp_path / name).read_text() == content
    assert [p.name for p in tmp_path.iterdir()] == [name]  # nothing else was written either


def test_the_studys_own_files_are_replaced(tmp_path: Path) -> None:
    first = [p.read_text() for p in _write(tmp_path)]
    again = [p.read_text() for p in _write(tmp_path)]
    assert first == again and len(again) == 3


def test_a_png_not_made_by_the_study_is_refused(tmp_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    photo = tmp_path / "ptq_reward_vs_bits.png"
    photo.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 64)  # someone's image, not a matplotlib figure
    with pytest.raises(InputError):
        save_png(plt.figure(), photo)
    assert photo.read_bytes().startswith(b"\x89PNG") and len(photo.read_bytes()) == 72
    ours = tmp_path / "ok.png"
    save_png(plt.figure(), ours)
    save_png(plt.figure(), ours)  # its own figure is replaced
    assert ours.is_file()
