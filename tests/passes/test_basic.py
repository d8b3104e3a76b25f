"""The basic passes' surroundings: the dependencies' logs quiet while they fold, and given back."""

from __future__ import annotations

import pytest

from tests.helpers import interleaved


def test_two_threads_folding_at_once_give_onnx_graphsurgeon_s_log_back():
    """onnx-graphsurgeon's log level is the process's: two folds at once, each restoring what
    it found on entry, left it at errors after both (the second found the first's)."""
    from onnx_graphsurgeon.logger import G_LOGGER

    from trtbuild.passes.basic import quiet_dependencies

    before = G_LOGGER.severity
    seen = interleaved(lambda: quiet_dependencies(verbose=False), inside=lambda: G_LOGGER.severity)
    assert seen == [G_LOGGER.ERROR]  # still quiet for the second: the first left
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
