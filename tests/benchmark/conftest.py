"""A profile file for the tiny random Llama on the native engine, shared by the bench tests."""

import pytest


@pytest.fixture(scope="session")
def tiny_profile(tiny_llama_dir, tmp_path_factory):
    path = tmp_path_factory.mktemp("profiles") / "tiny.toml"
    path.write_text(
        f'name = "tiny"\nbackend = "native"\ndtype = "float32"\n'
        f'[model]\npath = "{tiny_llama_dir}"\nserved_name = "tiny"\n'
    )
    yield str(path)
    from inferplug.backends.registry import close_backend

    close_backend(str(path))
