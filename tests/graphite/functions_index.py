#!/usr/bin/python3
"""Prints graphite-web's function registry as JSON: {name: {"group", "params"}}, each param as its
own `toJSON()` gives it (what /functions would list). Run by `graphite-web.sh index`, which sets
Python's path and Django's settings."""
import json

import django

django.setup()

from graphite.functions import SeriesFunctions  # noqa: E402

index = {
    name: {'group': getattr(f, 'group', None), 'params': [p.toJSON() for p in f.params]}
    for name, f in SeriesFunctions().items()
}
print(json.dumps(index, sort_keys=True).replace('Infinity', '1e9999'))
