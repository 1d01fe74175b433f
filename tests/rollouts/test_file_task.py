"""task=file: bad dataset files and reward-function specs fail with the file, line or key named."""

from __future__ import annotations

import pytest

from rllm_torch.core.errors import ConfigError, DatasetFormatError, DatasetNotFoundError
from rllm_torch.rollouts.file_task import load_reward_fn, load_rows


def test_a_line_that_is_not_json_is_refused_naming_the_file_and_its_line_number(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text('{"prompt": "1+1=", "answer": "2"}\n\nnot json\n')
    with pytest.raises(
        DatasetFormatError,
        match=r"train.jsonl', line 3: not valid JSON \(Expecting value at column 1\); each line must be one JSON object",
    ) as caught:
        load_rows(str(path))
    assert not isinstance(caught.value, DatasetNotFoundError)  # the file is there: its content is wrong


def test_a_line_that_is_json_but_not_an_object_is_refused_naming_its_line(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text("[1, 2]\n")
    with pytest.raises(DatasetFormatError, match=r"train.jsonl', line 1: expected a JSON object, got list"):
        load_rows(str(path))


@pytest.mark.parametrize("content", ["", "\n  \n"])
def test_an_empty_jsonl_file_is_refused_as_having_no_rows(tmp_path, content):
    path = tmp_path / "empty.jsonl"
    path.write_text(content)
    with pytest.raises(
        DatasetFormatError,
        match=r"dataset file '.*empty.jsonl' has no rows; give at least one row with keys 'prompt' and 'answer'",
    ):
        load_rows(str(path))


def test_an_empty_parquet_file_is_refused_as_having_no_rows(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "empty.parquet"
    pq.write_table(pa.table({"prompt": pa.array([], pa.string()), "answer": pa.array([], pa.string())}), path)
    with pytest.raises(DatasetFormatError, match="empty.parquet' has no rows"):
        load_rows(str(path))


def test_a_missing_file_is_not_found_and_a_row_without_the_keys_is_a_format_error(tmp_path):
    with pytest.raises(DatasetNotFoundError, match="does not exist"):
        load_rows(str(tmp_path / "missing.jsonl"))
    path = tmp_path / "train.jsonl"
    path.write_text('{"question": "1+1="}\n')
    with pytest.raises(DatasetFormatError, match=r"row 0: needs keys 'prompt' and 'answer', has \['question'\]"):
        load_rows(str(path))


@pytest.mark.parametrize("spec", ["mypk.rw", "mypk.rw:", ":score"])
def test_a_reward_fn_without_the_module_colon_function_form_is_refused_with_an_example(spec):
    with pytest.raises(
        ConfigError, match=r"use 'exact_match' or the 'module:function' form, e.g. task.reward_fn=my_rewards:score"
    ):
        load_reward_fn(spec)


def test_a_reward_fn_in_the_module_colon_function_form_is_loaded():
    assert load_reward_fn("rllm_torch.rollouts.task:exact_match_reward")({"answer": "7"}, "7") == 1.0
