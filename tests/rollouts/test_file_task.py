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
    path.write_text('\n{"question": "1+1="}\n')  # a blank first line: the row is on line 2, as an editor shows it
    with pytest.raises(
        DatasetFormatError,
        match=r"line 2: no 'prompt' key \(task.prompt_key=prompt\); the row has \['question'\]: set task.prompt_key to "
        r"the key that holds it, e.g. task.prompt_key=question\.",
    ):
        load_rows(str(path))
    path.write_text('{"prompt": "1+1=", "solution": "2"}\n')
    with pytest.raises(
        DatasetFormatError, match=r"no 'answer' key \(task.answer_key=answer\).* e.g. task.answer_key=solution"
    ):
        load_rows(str(path))


@pytest.mark.parametrize("spec", ["mypk.rw", "mypk.rw:", ":score"])
def test_a_reward_fn_without_the_module_colon_function_form_is_refused_with_an_example(spec):
    with pytest.raises(
        ConfigError, match=r"use 'exact_match' or the 'module:function' form, e.g. task.reward_fn=my_rewards:score"
    ):
        load_reward_fn(spec)


def test_a_reward_fn_in_the_module_colon_function_form_is_loaded():
    assert load_reward_fn("rllm_torch.rollouts.task:exact_match_reward")({"answer": "7"}, "7") == 1.0


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"prompt": null, "answer": "3"}', "'prompt' must be a non-empty string, got null"),
        ('{"prompt": "", "answer": "3"}', "'prompt' must be a non-empty string, got str ''"),
        ('{"prompt": 12, "answer": "3"}', "'prompt' must be a non-empty string, got int 12"),
        ('{"prompt": "1+2=", "answer": null}', "'answer' must be a string, an integer or a finite number, got null"),
        ('{"prompt": "1+2=", "answer": NaN}', "'answer' must be .* got float nan"),
        ('{"prompt": "1+2=", "answer": true}', "'answer' must be .* got bool True"),
        ('{"prompt": "1+2=", "answer": [3]}', "'answer' must be .* got list \\[3\\]"),
    ],
)
def test_a_null_nan_or_non_text_value_is_refused_naming_the_line_as_a_person_counts_it(tmp_path, line, message):
    path = tmp_path / "train.jsonl"
    path.write_text('{"prompt": "1+1=", "answer": "2"}\n' + line + "\n")
    with pytest.raises(DatasetFormatError, match=rf"train.jsonl', line 2: {message}"):
        load_rows(str(path))


def test_integer_and_float_answers_become_their_text():
    import tempfile
    from pathlib import Path

    path = Path(tempfile.mkdtemp()) / "train.jsonl"
    path.write_text('{"prompt": "1+2=", "answer": 3}\n{"prompt": "5/2=", "answer": 2.5}\n')
    assert [r["answer"] for r in load_rows(str(path))] == ["3", "2.5"]


def test_parquet_nulls_and_nan_cells_are_refused_naming_the_row(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "train.parquet"
    pq.write_table(pa.table({"prompt": ["1+1=", None], "answer": ["2", "3"]}), path)
    with pytest.raises(
        DatasetFormatError, match="train.parquet', row 2: 'prompt' must be a non-empty string, got null"
    ):
        load_rows(str(path))
    pq.write_table(pa.table({"prompt": ["1+1=", "1+2="], "answer": [2.0, float("nan")]}), path)
    with pytest.raises(DatasetFormatError, match="row 2: 'answer' must be .* got float nan"):
        load_rows(str(path))


def test_a_file_that_is_not_utf8_or_not_parquet_is_a_format_error_naming_it(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_bytes(b'{"prompt": "1+1=", "answer": "2"}\n{"prompt": "caf\xe9", "answer": "x"}\n')
    with pytest.raises(DatasetFormatError, match="train.jsonl', line 2: not UTF-8 text \\(byte 0xe9 at column 16\\)"):
        load_rows(str(path))
    fake = tmp_path / "train.parquet"
    fake.write_text("prompt,answer\n1+1=,2\n")
    with pytest.raises(DatasetFormatError, match="train.parquet' is not a readable Parquet file"):
        load_rows(str(fake))


@pytest.mark.parametrize(
    "source, error",
    [("def score(:\n", "SyntaxError"), ("raise RuntimeError('no GPU here')\n", "RuntimeError: no GPU here")],
)
def test_a_reward_module_that_fails_at_import_is_a_config_error_naming_the_setting(
    tmp_path, monkeypatch, source, error
):
    (tmp_path / "broken_rewards.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match=rf"task.reward_fn='broken_rewards:score': cannot import it \({error}"):
        load_reward_fn("broken_rewards:score")


def test_a_rows_own_data_source_wins_over_the_files(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text('{"prompt": "a", "answer": "1", "data_source": "mine"}\n{"prompt": "b", "answer": "2"}\n')
    assert [r["data_source"] for r in load_rows(str(path), data_source="train")] == ["mine", "train"]
