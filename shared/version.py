"""The single source of the project's version string."""

from importlib import metadata


def version() -> str:
    try:
        return metadata.version("runnerscale")
    except metadata.PackageNotFoundError:  # running from a source tree without install
        return "0.0.0+source"
