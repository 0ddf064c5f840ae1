"""The floor under everything: what a workbench process needs of its operating system and runtimes.

``process`` (is a process alive, has our parent gone, files written atomically), ``loop`` (the event loop every
process runs on), ``tensorflow`` (TensorFlow imported quietly and only as far as a SavedModel needs). Nothing here
imports the rest of workbench.
"""
