"""Griffe extension: the registered algorithm factories documented with their signature and
docstring as users call them.

``@register`` (and ``@with_settings``, which it usually wraps) give a factory keyword parameters
and docstring entries that its source does not spell out (the shared settings declared once in
``fedjax_dro.core.settings.DECLARED``, and ``precision``). For every function decorated with
``register(...)``, this extension replaces the statically read parameters and docstring with
those of the imported object (``inspect.signature`` and ``__doc__``).
"""

from __future__ import annotations

import inspect

import griffe


class RuntimeFactorySignatures(griffe.Extension):
  def on_function_instance(self, *, node, func: griffe.Function, agent, **kwargs) -> None:
    if not any(str(d.value).startswith("register(") for d in func.decorators):
      return
    obj = griffe.dynamic_import(func.path)
    params = []
    for p in inspect.signature(obj).parameters.values():
      default = None if p.default is inspect.Parameter.empty else repr(p.default)
      params.append(
        griffe.Parameter(p.name, kind=griffe.ParameterKind(p.kind.description), default=default)
      )
    func.parameters = griffe.Parameters(*params)
    if func.docstring is not None and obj.__doc__:
      func.docstring.value = inspect.cleandoc(obj.__doc__)
