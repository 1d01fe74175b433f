"""rLLM's examples/countdown/prepare_countdown_data.py, ported: the same registrations
(``DatasetRegistry.register_dataset("countdown", rows, "train" / "test")``, rLLM's row format and
question text) with the rows generated here instead of downloaded (``Jiayi-Pan/Countdown-Tasks-3to4``
needs the network). The splits go where rLLM keeps them (``$RLLM_HOME/datasets``, else
``~/.rllm/datasets``), so the ported examples load them by name, as rLLM's do:

    python examples/rllm_countdown/prepare_countdown_data.py [train_rows] [test_rows]
"""

import sys

from rllm_torch.compat.rllm.data.dataset import DatasetRegistry
from rllm_torch.rollouts.countdown import countdown_rows


def prepare_countdown_data(train_size: int = 1024, test_size: int = 64):
    train_dataset = DatasetRegistry.register_dataset(
        "countdown", countdown_rows(train_size, seed=0, rllm_question=True), "train"
    )
    test_dataset = DatasetRegistry.register_dataset(
        "countdown", countdown_rows(test_size, seed=1, rllm_question=True), "test"
    )
    return train_dataset, test_dataset


if __name__ == "__main__":
    train_dataset, test_dataset = prepare_countdown_data(*map(int, sys.argv[1:3]))
    print("Train dataset path:", train_dataset.get_data_path())
    print("Test dataset path:", test_dataset.get_data_path())
    print("\nSample train example:")
    print(train_dataset[0])
