# mmsp's version: the one place it is written. CMakeLists.txt's project() and pyproject.toml
# (scikit-build-core's regex provider) read it from here.
__version__ = "0.1.0"
