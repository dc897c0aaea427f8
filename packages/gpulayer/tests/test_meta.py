"""The meta distribution installs its siblings at its own version."""

from importlib.metadata import requires, version


def test_meta_pins_its_siblings_at_its_own_version():
    own = version("gpulayer")
    pinned = [req for req in requires("gpulayer") or [] if req.startswith("gpulayer")]
    assert "gpulayer-runtime==" + own in pinned
    assert all("==" + own in req for req in pinned)


def test_installing_it_gives_the_runtime():
    import gpulayer.runtime

    assert gpulayer.runtime.__version__ == version("gpulayer")


def test_installing_it_gives_the_trainer():
    import gpulayer.trainer

    assert gpulayer.trainer.__version__ == version("gpulayer")


def test_installing_it_gives_the_callbacks():
    import gpulayer.callbacks

    assert gpulayer.callbacks.__version__ == version("gpulayer")
