"""The search spaces that ship with scalertune, installed as ``scalertune.search_spaces``."""
