"""mkdocs hook: the pages' math rendered to MathML when the site is built, so that it shows
offline (browsers render MathML natively; no script and no CDN).

``pymdownx.arithmatex`` (generic mode) wraps inline math in ``<span class="arithmatex">\\(...\\)
</span>`` and display math in ``<div class="arithmatex">\\[...\\]</div>``; this hook replaces each
with ``latex2mathml``'s MathML (display math inside ``<div class="math-display">``, which
``docs/stylesheets/math.css`` lets scroll sideways when a formula is wider than the column).

``latex2mathml`` leaves the alignment environments (``aligned``, ``align``, ``split``,
``gathered``, ...) as a flat row with a literal ``&`` (not even well-formed XML) and ignored
``\\\\`` breaks, and prints commands it does not know (``\\arg``) with their backslash. So,
before converting, each alignment environment (and a formula with a top-level ``&`` or ``\\\\``)
is cut into rows and cells and rendered as an ``<mtable>`` (cells converted one by one; columns
right, left, right, left, ... as amsmath aligns them), and the operator names latex2mathml lacks
become ``\\operatorname``. The result must parse as XML and hold no ``\\`` nor a literal ``&``
in any text: a formula that does not fails the build, naming the page.
"""

import html
import re
import xml.etree.ElementTree as ET

import latex2mathml.converter

INLINE = re.compile(r'<span class="arithmatex">\\\((.*?)\\\)</span>', re.S)
DISPLAY = re.compile(r'<div class="arithmatex">\\\[(.*?)\\\]</div>', re.S)

# environment -> how its columns align: "rl" (pairs right, left, as align), "c" (centred, as
# gather), "rcl" (eqnarray)
TABLE_ENVIRONMENTS = {
  **{e: "rl" for e in ("aligned", "align", "align*", "alignat", "alignat*", "alignedat")},
  **{e: "rl" for e in ("split", "flalign", "flalign*")},
  **{e: "c" for e in ("gathered", "gather", "gather*", "multline", "multline*")},
  **{e: "rcl" for e in ("eqnarray", "eqnarray*")},
}
# operator names latex2mathml prints raw (with their backslash): rendered as \operatorname
OPERATOR_NAMES = ("arg",)
PLACEHOLDER = "FEDJAXMATHTABLE{}X"
PLACEHOLDER_MTEXT = re.compile(r"<mtext>FEDJAXMATHTABLE(\d+)X</mtext>")
MATH_TAGS = re.compile(r"^<math[^>]*>(.*)</math>$", re.S)
COLUMN_GAP = "2em"  # between two right/left pairs, as amsmath's align


TEXT_COMMAND = re.compile(
  r"\\(text|texttt|textrm|textit|textbf|textsf|textnormal|mbox)\s*\{((?:[^{}]|\{[^{}]*\})*)\}"
)


def _text(m: re.Match) -> str:
  r"""A text command whose argument latex2mathml will copy verbatim: ``\_`` ``\%`` ``\$``
  ``\#`` ``\&`` as their characters, ``&`` ``<`` ``>`` escaped for XML."""
  text = re.sub(r"\\([_%$#&])", r"\1", m.group(2))
  return f"\\{m.group(1)}{{{html.escape(text, quote=False)}}}"


def _prepare(latex: str) -> str:
  r"""``latex`` with the operator names latex2mathml lacks made operators (``\arg\min`` /
  ``\arg\max`` -> its ``\argmin`` / ``\argmax``, other names of ``OPERATOR_NAMES`` ->
  ``\operatorname{name}``) and text arguments escaped (``_text``)."""
  latex = re.sub(r"\\arg\s*\\(min|max)(?![a-zA-Z])", r"\\arg\1", latex)
  for name in OPERATOR_NAMES:
    latex = re.sub(rf"\\{name}(?![a-zA-Z])", rf"\\operatorname{{{name}}}", latex)
  return TEXT_COMMAND.sub(_text, latex)


def _split_table(body: str) -> list[list[str]]:
  r"""The rows of ``body``, each a list of cells: split at the ``\\`` and ``&`` that are outside
  braces and nested environments (``\&`` is a character; ``\\[2pt]`` drops its spacing)."""
  rows, cells, start, depth, env_depth, i = [], [], 0, 0, 0, 0
  while i < len(body):
    c = body[i]
    if c == "\\":
      m = re.match(
        r"\\(begin|end)\s*\{[^}]*\}|\\\\(\s*\[[^\]]*\])?|\\[a-zA-Z]+|\\.", body[i:], re.S
      )
      token = m.group(0)
      if token.startswith("\\begin"):
        env_depth += 1
      elif token.startswith("\\end"):
        env_depth -= 1
      elif token.startswith("\\\\") and depth == 0 and env_depth == 0:
        rows.append(cells + [body[start:i]])
        cells, start = [], i + len(token)
      i += len(token)
      continue
    if c == "{":
      depth += 1
    elif c == "}":
      depth -= 1
    elif c == "&" and depth == 0 and env_depth == 0:
      cells.append(body[start:i])
      start = i + 1
    i += 1
  rows.append(cells + [body[start:]])
  if len(rows) > 1 and all(not cell.strip() for cell in rows[-1]):  # a final \\ ends no row
    rows.pop()
  return rows


def _strip_numbering(row: list[str]) -> list[str]:
  r"""A row without ``\label``, ``\nonumber``, ``\notag``; a ``\tag{x}`` shown as ``(x)`` at its
  end."""
  out = []
  for cell in row:
    cell = re.sub(r"\\label\s*\{[^}]*\}|\\nonumber|\\notag", "", cell)
    cell = re.sub(r"\\tag\*?\s*\{([^}]*)\}", r"\\qquad (\1)", cell)
    out.append(cell)
  return out


def _inner(latex: str) -> str:
  """The MathML of ``latex`` without its ``<math>`` element ("" for an empty cell)."""
  if not latex.strip():
    return ""
  return MATH_TAGS.match(_convert(latex, "inline")).group(1)


def _table(rows: list[list[str]], align: str) -> str:
  """An ``<mtable>`` of ``rows``: ``align`` "rl" aligns columns right, left, right, left, ...
  (a gap between pairs; a left cell starts with ``{}`` so that its relation is spaced as a
  binary one), "c" centres, "rcl" aligns right, centre, left."""
  ncols = max(len(r) for r in rows)
  if align == "rl":
    aligns = ["right" if j % 2 == 0 else "left" for j in range(ncols)]
  elif align == "rcl":
    aligns = (["right", "center", "left"] * ncols)[:ncols]
  else:
    aligns = ["center"] * ncols
  spacing = ["0em" if align == "rl" and j % 2 == 0 else COLUMN_GAP for j in range(ncols - 1)]
  trs = []
  for row in rows:
    tds = []
    for j, cell in enumerate(_strip_numbering(row) + [""] * (ncols - len(row))):
      if align == "rl" and j % 2 == 1 and cell.strip():
        cell = "{}" + cell
      pad = []
      if align == "rl":
        pad.append("padding-right: 0" if j % 2 == 0 else "padding-left: 0")
        if j % 2 == 0 and j > 0:
          pad.append(f"padding-left: {COLUMN_GAP}")
      style = "; ".join([f"text-align: {aligns[j]}"] + pad)
      tds.append(f'<mtd columnalign="{aligns[j]}" style="{style}">{_inner(cell)}</mtd>')
    trs.append("<mtr>" + "".join(tds) + "</mtr>")
  return (
    f'<mtable class="math-aligned" displaystyle="true" columnalign="{" ".join(aligns)}"'
    f' columnspacing="{" ".join(spacing) or "0em"}">' + "".join(trs) + "</mtable>"
  )


def _extract_tables(latex: str) -> tuple[str, list[str]]:
  """``latex`` with every alignment environment replaced by a placeholder, and the MathML
  tables of those environments (nested ones rendered inside their cells)."""
  tables = []
  pattern = re.compile(r"\\begin\s*\{(" + "|".join(map(re.escape, TABLE_ENVIRONMENTS)) + r")\}")
  while m := pattern.search(latex):
    env = m.group(1)
    # the matching \end{env}, nested environments of the same name counted
    depth, pos, end = 1, m.end(), None
    for e in re.finditer(r"\\(begin|end)\s*\{" + re.escape(env) + r"\}", latex[m.end() :]):
      depth += 1 if e.group(1) == "begin" else -1
      if depth == 0:
        pos, end = m.end() + e.start(), m.end() + e.end()
        break
    if end is None:
      raise ValueError(f"\\begin{{{env}}} without \\end{{{env}}}")
    body = latex[m.end() : pos]
    if env.startswith("alignat") or env == "alignedat":  # the column-count argument
      body = re.sub(r"^\s*\{[^}]*\}", "", body)
    tables.append(_table(_split_table(body), TABLE_ENVIRONMENTS[env]))
    latex = latex[: m.start()] + "\\text{" + PLACEHOLDER.format(len(tables) - 1) + "}" + latex[end:]
  return latex, tables


def _convert(latex: str, display: str) -> str:
  """``latex`` (prepared by ``_prepare``) as a ``<math>`` element, alignment environments as
  tables."""
  latex, tables = _extract_tables(latex)
  rows = _split_table(latex)
  if len(rows) > 1 or len(rows[0]) > 1:  # a top-level & or \\: an implicit aligned
    tables.append(_table(rows, "rl" if any(len(r) > 1 for r in rows) else "c"))
    latex = "\\text{" + PLACEHOLDER.format(len(tables) - 1) + "}"
  out = latex2mathml.converter.convert(latex, display=display)
  return PLACEHOLDER_MTEXT.sub(lambda m: tables[int(m.group(1))], out)


def check(mathml: str) -> None:
  """Raise ``ValueError`` unless ``mathml`` is well-formed XML (a raw ``&``, latex2mathml's
  output for an alignment it does not render, is not) without an escaped alignment ``&``
  (``<mi>&amp;</mi>``) or a ``\\`` in its text (a command latex2mathml printed raw). A ``\\&``
  written in the LaTeX stays: latex2mathml writes it ``&#x00026;``."""
  if "<mi>&amp;</mi>" in mathml:
    raise ValueError("the MathML holds an alignment & as an identifier")
  try:
    root = ET.fromstring(mathml)
  except ET.ParseError as e:
    raise ValueError(f"the MathML is not well-formed XML ({e})") from e
  for element in root.iter():
    for text in (element.text, element.tail):
      if text and "\\" in text:
        raise ValueError(f"the MathML holds the raw text {text!r}")


def to_mathml(latex: str, display: bool, where: str) -> str:
  """The MathML of ``latex`` (HTML-escaped as arithmatex leaves it)."""
  try:
    mathml = _convert(_prepare(html.unescape(latex).strip()), "block" if display else "inline")
    check(mathml)
    return mathml
  except Exception as e:  # a formula the converter does not know: fail the build
    raise ValueError(f"{where}: cannot render the math {latex!r} to MathML: {e}") from e


def render(content: str, where: str = "page") -> str:
  """``content`` with every arithmatex formula replaced by MathML."""
  content = DISPLAY.sub(
    lambda m: '<div class="math-display">' + to_mathml(m.group(1), True, where) + "</div>", content
  )
  return INLINE.sub(lambda m: to_mathml(m.group(1), False, where), content)


def on_page_content(html_text, page, config, files):
  return render(html_text, page.file.src_uri)
