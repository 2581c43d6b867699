"""Packaging beyond pyproject.toml: the browser page (web/) and the shipped pipelines (pipelines/)
stay at the top of the repository, where people look for them, and install as package data under
streamkit/web and streamkit/pipelines (streamkit.shipped finds them in either place)."""
from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["streamkit", "streamkit.*"]), "streamkit.web", "streamkit.pipelines"],
    package_dir={"streamkit.web": "web", "streamkit.pipelines": "pipelines"},
    package_data={
        "streamkit.web": ["*.html", "*.js", "*.css", "*.svg", "*.png", "*.ico"],
        "streamkit.pipelines": ["*.yaml"],
        # the native CPU kernels are compiled on the machine that runs them (streamkit/engine/native)
        "streamkit.engine.native": ["*.c", "*.h"],
    },
)
