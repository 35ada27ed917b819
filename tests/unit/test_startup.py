"""launcher/core/startup.py: the training code's imports made with the collector paused, then frozen."""
import gc
import sys

import pytest

from launcher.core.startup import long_lived_imports


@pytest.fixture
def unfrozen():
    """The worker's heap as it was: what a test froze is handed back to the collector."""
    yield
    gc.unfreeze()


@pytest.mark.parametrize("enabled", [True, False])
def test_the_collector_is_paused_inside_and_as_it_was_after(unfrozen, enabled):
    (gc.enable if enabled else gc.disable)()
    try:
        with long_lived_imports():
            inside = gc.isenabled()
        assert (inside, gc.isenabled()) == (False, enabled)
    finally:
        gc.enable()


def test_what_was_imported_is_frozen_and_a_failed_import_still_resumes_collecting(unfrozen):
    sys.modules.pop("fractions", None)
    before = gc.get_freeze_count()
    with long_lived_imports():
        import fractions  # noqa: F401  (a module the worker has not imported: its objects are new)
    assert gc.get_freeze_count() > before
    with pytest.raises(ModuleNotFoundError):
        with long_lived_imports():
            import no_such_module_here  # noqa: F401
    assert gc.isenabled()
