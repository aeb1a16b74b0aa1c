"""One public request output: inferplug.RequestOutput; the output stage's old name for its own type still works for
one release, with a warning that names the new ones."""

from __future__ import annotations

import pytest


def test_the_stages_old_request_output_name_warns_and_names_the_new_ones():
    from inferplug.errors import InferPlugDeprecationWarning
    from inferplug.stages import output

    with pytest.warns(InferPlugDeprecationWarning, match="renamed RequestChoices.*public request output is "
                                                "inferplug.RequestOutput"):
        old = output.RequestOutput
    assert old is output.RequestChoices


def test_the_public_request_output_is_the_offline_llms():
    import inferplug
    from inferplug.llm import RequestOutput

    assert inferplug.RequestOutput is RequestOutput
