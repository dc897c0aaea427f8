from gpulayer.runtime.cli import entry

entry()
