"""The basic passes' surroundings: the dependencies' logs quiet while they fold, and given back."""

from __future__ import annotations

import threading

import pytest


def test_two_threads_folding_at_once_give_onnx_graphsurgeon_s_log_back():
    """onnx-graphsurgeon's log level is the process's: two folds at once, each restoring what
    it found on entry, left it at errors after both (the second found the first's)."""
    from onnx_graphsurgeon.logger import G_LOGGER

    from trtbuild.passes.basic import quiet_dependencies

    before = G_LOGGER.severity
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()

    def first() -> None:
        with quiet_dependencies(verbose=False):
            first_in.set()
            second_in.wait(10)
        first_out.set()

    def second() -> None:
        first_in.wait(10)
        with quiet_dependencies(verbose=False):
            assert G_LOGGER.severity == G_LOGGER.ERROR  # still quiet: the first left
            second_in.set()
            first_out.wait(10)

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert G_LOGGER.severity == before


@pytest.mark.parametrize("key", ["freeze_inputs", "override_input_shapes"])
def test_an_unknown_input_in_the_passes_names_the_policy_file_and_line(tmp_path, key):
    """The name is written in the policy: its file and line, as every other field's error
    (freeze_inputs named no file at all, override_input_shapes the model's)."""
    from tests.helpers import identity_policy
    from trtbuild.api import check
    from trtbuild.errors import UsageError
    from trtbuild.policy import load_policy

    value = "3" if key == "freeze_inputs" else "[1, 4]"
    path = identity_policy(
        tmp_path, [1, 4], "{shape: [1, 4]}", f"passes:\n  {key}:\n    z: {value}\n"
    )
    with pytest.raises(UsageError) as info:
        check(load_policy(path), quiet=True)
    said = str(info.value)
    assert said.startswith(f"{path.resolve()}:7: passes.{key}.z: the model has no input 'z'")
    assert said.endswith("(name one of the model's inputs: x)")
