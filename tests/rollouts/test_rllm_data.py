"""rLLM's ``rllm.data`` (``rllm/data/dataset.py``, rLLM main 9beb6e0f) at its path: ``Dataset``'s
methods give rLLM's rows, and ``DatasetRegistry`` stores splits as rLLM does (``<dir>/registry.json``,
version 2, one Parquet file per split), so a registry in rLLM's layout, as rLLM's
``prepare_countdown_data.py`` leaves it, loads here unchanged."""

from __future__ import annotations

import json

import pyarrow
import pyarrow.parquet
import pytest

from rllm_torch.compat.rllm.data import Dataset, DatasetRegistry
from rllm_torch.compat.rllm.data.dataset import DatasetRegistry as RegistryAtRllmsModulePath
from rllm_torch.core.errors import ConfigError, DatasetFormatError

ROWS = [
    {"question": "Using the numbers 1, 2, 3, find 6.", "ground_truth": "6", "target": 6, "nums": [1, 2, 3]},
    {"question": "Using the numbers 4, 5, find 9.", "ground_truth": "9", "target": 9, "nums": [4, 5]},
]


@pytest.fixture
def registry_dir(tmp_path):
    DatasetRegistry.set_dataset_dir(tmp_path)
    yield tmp_path
    DatasetRegistry.set_dataset_dir(None)


def test_a_registered_split_loads_back_with_the_same_rows_name_and_split(registry_dir):
    made = DatasetRegistry.register_dataset("countdown", ROWS, "train")
    loaded = DatasetRegistry.load_dataset("countdown", "train")
    assert loaded.get_data() == ROWS and made.get_data() == ROWS
    assert (loaded.name, loaded.split, len(loaded), loaded[1]["nums"]) == ("countdown", "train", 2, [4, 5])
    assert RegistryAtRllmsModulePath is DatasetRegistry


def test_the_registry_file_and_split_file_are_in_rllms_layout(registry_dir):
    DatasetRegistry.register_dataset(
        "countdown", ROWS, "test", source="Jiayi-Pan/Countdown-Tasks-3to4", category="math"
    )
    registry = json.loads((registry_dir / "registry.json").read_text())
    assert registry == {
        "version": 2,
        "datasets": {
            "countdown": {
                "metadata": {"source": "Jiayi-Pan/Countdown-Tasks-3to4", "category": "math"},
                "splits": {
                    "test": {
                        "path": "countdown/test.parquet",
                        "num_examples": 2,
                        "fields": ["question", "ground_truth", "target", "nums"],
                    }
                },
            }
        },
    }
    assert pyarrow.parquet.read_table(registry_dir / "countdown" / "test.parquet").to_pylist() == ROWS


def test_a_registry_written_as_rllm_writes_it_loads_here(registry_dir):
    # what rLLM's register_dataset leaves: the split's Parquet (pandas, with its index metadata), an
    # absolute path in the registry is taken as it is
    split_file = registry_dir / "elsewhere.parquet"
    pyarrow.parquet.write_table(pyarrow.Table.from_pylist(ROWS), split_file)
    (registry_dir / "registry.json").write_text(
        json.dumps(
            {"version": 2, "datasets": {"countdown": {"metadata": {}, "splits": {"train": {"path": str(split_file)}}}}}
        )
    )
    assert DatasetRegistry.load_dataset("countdown", "train").get_data() == ROWS
    assert Dataset(ROWS, "countdown", "train").get_data_path() == str(split_file)


def test_the_default_directory_is_rllm_home_datasets_as_in_rllm(tmp_path, monkeypatch):
    monkeypatch.setenv("RLLM_HOME", str(tmp_path / "home"))
    assert DatasetRegistry.dataset_dir() == str(tmp_path / "home" / "datasets")
    DatasetRegistry.register_dataset("d", ROWS[:1])  # split "default", rLLM's default
    assert DatasetRegistry.get_dataset_splits("d") == ["default"]
    assert (tmp_path / "home" / "datasets" / "d" / "default.parquet").exists()


def test_missing_dataset_split_or_file_is_none_as_in_rllm(registry_dir):
    assert DatasetRegistry.load_dataset("nothing", "train") is None
    DatasetRegistry.register_dataset("countdown", ROWS, "train")
    assert DatasetRegistry.load_dataset("countdown", "test") is None
    (registry_dir / "countdown" / "train.parquet").unlink()
    assert DatasetRegistry.load_dataset("countdown", "train") is None


def test_names_splits_exists_and_removal(registry_dir):
    DatasetRegistry.register_dataset("a", ROWS, "train")
    DatasetRegistry.register_dataset("a", ROWS[:1], "test")
    DatasetRegistry.register_dataset("b", ROWS, "train")
    assert DatasetRegistry.get_dataset_names() == ["a", "b"]
    assert DatasetRegistry.get_dataset_splits("a") == ["train", "test"]
    assert DatasetRegistry.dataset_exists("a") and DatasetRegistry.dataset_exists("a", "test")
    assert not DatasetRegistry.dataset_exists("a", "val") and not DatasetRegistry.dataset_exists("c")
    assert DatasetRegistry.remove_dataset_split("a", "train") is True
    assert DatasetRegistry.get_dataset_splits("a") == ["test"] and not (registry_dir / "a" / "train.parquet").exists()
    assert DatasetRegistry.remove_dataset_split("a", "test") is True  # the last split: the dataset goes
    assert DatasetRegistry.get_dataset_names() == ["b"] and not (registry_dir / "a").exists()
    assert DatasetRegistry.remove_dataset("b") is True and DatasetRegistry.get_dataset_names() == []
    assert DatasetRegistry.remove_dataset("b") is False and DatasetRegistry.remove_dataset_split("b", "x") is False


def test_registering_a_split_again_replaces_it(registry_dir):
    DatasetRegistry.register_dataset("a", ROWS, "train")
    DatasetRegistry.register_dataset("a", ROWS[1:], "train")
    assert DatasetRegistry.load_dataset("a", "train").get_data() == ROWS[1:]
    assert DatasetRegistry.get_dataset_info("a")["splits"]["train"]["num_examples"] == 1


def test_refusals_name_the_problem(registry_dir):
    with pytest.raises(ConfigError, match="split='a/b' must be a plain file name"):
        DatasetRegistry.register_dataset("x", ROWS, "a/b")
    with pytest.raises(ConfigError, match="row 0 is not a dict"):
        DatasetRegistry.register_dataset("x", ["text"])
    with pytest.raises(DatasetFormatError, match="'x'"):
        DatasetRegistry.register_dataset("x", [{"v": 1}, {"v": "one"}])
    with pytest.raises(ConfigError, match="as_tasks=True"):
        DatasetRegistry.load_dataset("x", "train", as_tasks=True)
    (registry_dir / "registry.json").write_text(json.dumps({"countdown": {"train": "/old/path.parquet"}}))
    with pytest.raises(DatasetFormatError, match="version-2"):
        DatasetRegistry.load_dataset("countdown", "train")


def test_repeat_keeps_copies_adjacent_and_refuses_non_positive_counts():
    rows = Dataset([{"i": 0}, {"i": 1}], "d", "s").repeat(2)
    assert rows.get_data() == [{"i": 0}, {"i": 0}, {"i": 1}, {"i": 1}] and (rows.name, rows.split) == ("d", "s")
    assert rows[0] is not rows[1]  # each copy its own dict, as rLLM's item.copy()
    with pytest.raises(ValueError, match="Repeat count must be positive"):
        Dataset([{"i": 0}]).repeat(0)


def test_shuffle_with_a_seed_gives_rllms_order_and_select_skips_out_of_range_indices():
    data = Dataset([{"i": i} for i in range(5)])
    # rLLM: random.Random(0).shuffle([0, 1, 2, 3, 4]) -> [2, 1, 0, 4, 3]
    assert [r["i"] for r in data.shuffle(seed=0)] == [2, 1, 0, 4, 3]
    assert [r["i"] for r in data.select([4, 7, -1, 0])] == [4, 0]  # 7 and -1 are outside [0, 5)
    assert [r["i"] for r in data.select(range(1, 3))] == [1, 2]


@pytest.mark.parametrize("ext", [".json", ".jsonl", ".parquet"])
def test_load_data_reads_each_of_rllms_file_formats(tmp_path, ext):
    path = tmp_path / f"rows{ext}"
    if ext == ".json":
        path.write_text(json.dumps(ROWS))
    elif ext == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    else:
        pyarrow.parquet.write_table(pyarrow.Table.from_pylist(ROWS), path)
    loaded = Dataset.load_data(str(path))
    assert loaded.get_data() == ROWS and loaded.name is None


def test_load_data_refuses_a_missing_file_and_an_unknown_format(tmp_path):
    with pytest.raises(FileNotFoundError, match="Dataset file not found"):
        Dataset.load_data(str(tmp_path / "none.json"))
    (tmp_path / "rows.txt").write_text("x")
    with pytest.raises(ValueError, match="Unsupported file format: .txt"):
        Dataset.load_data(str(tmp_path / "rows.txt"))


def test_the_verl_copy_is_found_only_when_rllm_wrote_one(registry_dir):
    made = DatasetRegistry.register_dataset("countdown", ROWS, "train")
    assert made.get_verl_data_path() is None and Dataset(ROWS).get_data_path() is None
    (registry_dir / "countdown" / "train_verl.parquet").write_bytes(b"")
    assert made.get_verl_data_path() == str(registry_dir / "countdown" / "train_verl.parquet")


def test_countdown_rows_with_rllm_question_write_rllms_question_text():
    from rllm_torch.rollouts.countdown import countdown_rows

    row = countdown_rows(1, seed=0, rllm_question=True)[0]
    assert (row["nums"], row["target"], row["ground_truth"]) == ([2, 5, 9], 90, "90")
    # examples/countdown/prepare_countdown_data.py's preprocess_fn, for nums [2, 5, 9] and target 90
    assert row["question"] == (
        "Using the numbers 2, 5, 9, find a way to reach the target number 90. You can use basic arithmetic "
        "operations (+, -, *, /) and each number can only be used once. Show your step-by-step calculation and "
        "output the final answer within <answer>...</answer>, for example <answer> (1 + 2) / 3 </answer>."
    )
    assert countdown_rows(1, seed=0)[0]["question"] == "2 5 9 = 90?"  # the short default is unchanged
