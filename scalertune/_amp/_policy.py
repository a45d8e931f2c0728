"""The runtime's policy numbers, each with the reason for its value: how large a YAML file
scalertune reads.

Numbers that more than one stage reads are in ``scalertune._policy``.
"""

#: The largest YAML file scalertune reads (a search space, a result file). A result file is a
#: few KB and a space a few hundred bytes; 1 MiB leaves room for any hand-written comment and
#: stops a wrong file (a dataset, a log) before the YAML parser spends memory on it.
MAX_YAML_BYTES = 2**20

#: The most values a YAML file may hold once its aliases are expanded. Aliases let a few
#: hundred bytes stand for billions of values (the "billion laughs"); anything that walks the
#: data (a ``str()``, a JSON dump into the study) would expand them. A real file has dozens.
MAX_YAML_VALUES = 10_000
