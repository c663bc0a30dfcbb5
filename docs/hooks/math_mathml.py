"""mkdocs hook: the pages' math rendered to MathML when the site is built, so that it shows
offline (browsers render MathML natively; no script and no CDN).

``pymdownx.arithmatex`` (generic mode) wraps inline math in ``<span class="arithmatex">\\(...\\)
</span>`` and display math in ``<div class="arithmatex">\\[...\\]</div>``; this hook replaces each
with ``latex2mathml``'s MathML. A formula it cannot convert fails the build, naming the page.
"""

import html
import re

import latex2mathml.converter

INLINE = re.compile(r'<span class="arithmatex">\\\((.*?)\\\)</span>', re.S)
DISPLAY = re.compile(r'<div class="arithmatex">\\\[(.*?)\\\]</div>', re.S)


def to_mathml(latex: str, display: bool, where: str) -> str:
  """The MathML of ``latex`` (HTML-escaped as arithmatex leaves it)."""
  try:
    return latex2mathml.converter.convert(
      html.unescape(latex).strip(), display="block" if display else "inline"
    )
  except Exception as e:  # a formula the converter does not know: fail the build
    raise ValueError(f"{where}: cannot render the math {latex!r} to MathML: {e}") from e


def render(content: str, where: str = "page") -> str:
  """``content`` with every arithmatex formula replaced by MathML."""
  content = DISPLAY.sub(lambda m: to_mathml(m.group(1), True, where), content)
  return INLINE.sub(lambda m: to_mathml(m.group(1), False, where), content)


def on_page_content(html_text, page, config, files):
  return render(html_text, page.file.src_uri)
