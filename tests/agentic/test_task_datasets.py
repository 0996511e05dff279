"""Team-task datasets (roll/agentic/tasks/datasets.py): real HF ``datasets`` on local files,
built-in sets, clear errors, and the seeded item order that checkpoints resume."""

import json

import pytest

from roll.agentic.tasks.datasets import ItemSampler, load_items
from roll.errors import ConfigError
from roll.utils.hub import PROXY_VARIABLES

ROWS = [{"problem": f"What is {i} + 1?", "solution": str(i + 1), "level": i % 3}
        for i in range(10)]


@pytest.fixture()
def jsonl(tmp_path):
    path = tmp_path / "problems.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    return path


def test_jsonl_with_field_mapping_and_split_slices(jsonl):
    fields = {"question": "problem", "answer": "solution"}
    train = load_items(str(jsonl), "train[:80%]", fields, ("question", "answer"))
    held_out = load_items(str(jsonl), "train[80%:]", fields, ("question", "answer"))
    assert [item["question"] for item in train] == [row["problem"] for row in ROWS[:8]]
    assert [item["answer"] for item in held_out] == ["9", "10"]
    assert train[3]["level"] == 0  # other columns are kept under their own names


def test_parquet_folder(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = tmp_path / "data"
    folder.mkdir()
    pq.write_table(pa.Table.from_pylist(ROWS[:5]), folder / "a.parquet")
    pq.write_table(pa.Table.from_pylist(ROWS[5:]), folder / "b.parquet")
    items = load_items(str(folder), "train", {"prompt": "problem"}, ("prompt",))
    assert sorted(item["prompt"] for item in items) == sorted(row["problem"] for row in ROWS)


def test_errors_name_the_field_or_source(jsonl, tmp_path):
    with pytest.raises(ConfigError, match=r"env.data.fields.answer='gold': the task needs field "
                                         r"'answer', read from column 'gold'"):
        load_items(str(jsonl), "train", {"question": "problem", "answer": "gold"},
                   ("question", "answer"))
    with pytest.raises(ConfigError, match=r"env.data.fields={}: the task needs field 'question'"):
        load_items(str(jsonl), "train", {}, ("question",))
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(ConfigError, match=rf"env.data.source='{missing}': no such file"):
        load_items(str(missing), "train", {}, ())
    with pytest.raises(ValueError, match=r"split 'test'"):
        load_items(str(jsonl), "test", {}, ())
    with pytest.raises(ValueError, match=r"unknown built-in set"):
        load_items("builtin:poetry", "train")


def test_builtin_sets_have_disjoint_seeds_per_split():
    train = load_items("builtin:arithmetic", "train", builtin_size=20)
    test = load_items("builtin:arithmetic", "test", builtin_size=20)
    assert len(train) == 20 and train == load_items("builtin:arithmetic", "train",
                                                    builtin_size=20)
    assert [t["question"] for t in train] != [t["question"] for t in test]
    for item in train:
        value = int(item["answer"])
        assert sorted(item["choices"], key=int) == [str(value - 1), str(value), str(value + 1)]
    prompts = load_items("builtin:writing", "train", builtin_size=5)
    assert len(prompts) == 5 and all(p["prompt"].startswith("Topic: ") for p in prompts)


def test_item_sampler_deals_each_epoch_as_a_permutation_and_resumes_exactly():
    sampler = ItemSampler(5, seed=3)
    dealt = sampler.take(3) + sampler.take(4) + sampler.take(3)  # two full epochs
    assert sorted(dealt[:5]) == list(range(5)) and sorted(dealt[5:]) == list(range(5))
    assert dealt[:5] != dealt[5:]  # a fresh order per epoch (this seed)
    again = ItemSampler(5, seed=3)
    assert again.take(10) == dealt
    resumed = ItemSampler(5, seed=3)
    resumed.load_state_dict(ItemSampler(5, seed=3).state_dict() | {"position": 7})
    assert resumed.take(3) == dealt[7:]
    assert ItemSampler(4, 0, shuffle=False).take(6) == [0, 1, 2, 3, 0, 1]
    with pytest.raises(ValueError, match=r"dataset of 5 items; env.data now has 6"):
        ItemSampler(6, 0).load_state_dict({"position": 1, "num_items": 5})


def test_a_hub_dataset_that_cannot_be_had_here_is_refused_at_once(tmp_path, monkeypatch):
    """No cache, no network: one error naming the source, not ~25 s of the Hub client's
    retries before 'Couldn't reach ... on the Hub'."""
    import socket

    with socket.socket() as probe:  # a local port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "tables"))
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", *PROXY_VARIABLES):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ConfigError, match=rf"^config error: env.data.source='someorg/no-such-"
                                          rf"set': is not a local file or folder, the Hugging "
                                          rf"Face cache does not hold it, and the Hub "
                                          rf"127.0.0.1:{port} cannot be reached"):
        load_items("someorg/no-such-set", "train", {}, ())
