"""The site's formulas render: the build hook (``docs/hooks/math_mathml.py``) turns alignment
environments into MathML tables and ``\\arg``, ``\\operatorname{...}`` into operators, every
``<math>`` element of the built site is well-formed XML without a raw alignment ``&`` or a
backslash in its text, display math scrolls inside the content column, and (where a Chromium is
installed) the main pages render to screenshots that are not blank."""

import importlib.util
import os
import pathlib
import re
import shutil
import struct
import subprocess
import sys
import xml.etree.ElementTree as ET
import zlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
M = "{http://www.w3.org/1998/Math/MathML}"
# the pages whose formulas held a literal & or a raw \arg before the hook rendered them
ALGORITHM_PAGES = ("algorithms/dro", "algorithms/personalized", "algorithms/baselines")


@pytest.fixture(scope="module")
def hook():
  pytest.importorskip("latex2mathml")
  spec = importlib.util.spec_from_file_location("math_mathml", DOCS / "hooks" / "math_mathml.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _text(element):
  """All the text under ``element``."""
  return "".join(element.itertext())


def _problems(mathml):
  """What is wrong with one ``<math>`` element: not well-formed XML, an alignment ``&`` kept as
  an identifier, a backslash in a text node (``[]`` when nothing)."""
  if "<mi>&amp;</mi>" in mathml:
    return ["alignment & as <mi>"]
  try:
    root = ET.fromstring(mathml)
  except ET.ParseError as e:
    return [f"not XML: {e}"]
  return [f"backslash in {t!r}" for e in root.iter() for t in (e.text, e.tail) if t and "\\" in t]


def test_an_aligned_environment_becomes_a_table(hook):
  latex = r"\begin{aligned} a &= b + c && \text{(one)} \\ x_1 &\leftarrow y \\ \end{aligned}"
  root = ET.fromstring(hook.to_mathml(latex, True, "test"))
  (table,) = root.iter(M + "mtable")
  rows = table.findall(M + "mtr")
  assert len(rows) == 2  # the final \\ ends no row
  cells = [[_text(td) for td in row.findall(M + "mtd")] for row in rows]
  assert cells == [["a", "=b+c", "", "(one)"], ["x1", "←y", "", ""]]
  assert [td.get("columnalign") for td in rows[0]] == ["right", "left", "right", "left"]
  assert "&" not in _text(root) and not _problems(hook.to_mathml(latex, True, "test"))


def test_nested_and_implicit_alignments_become_tables(hook):
  nested = r"f = \begin{aligned} a &= \begin{aligned} b &= c \\ d &= e \end{aligned} \\ g &= h"
  nested += r"\end{aligned}"
  root = ET.fromstring(hook.to_mathml(nested, True, "test"))
  assert len(list(root.iter(M + "mtable"))) == 2
  assert _text(root).startswith("f=")
  implicit = ET.fromstring(hook.to_mathml(r"a &= b \\ c &= d", True, "test"))
  assert [len(r) for r in implicit.iter(M + "mtr")] == [2, 2]
  gathered = ET.fromstring(hook.to_mathml(r"\begin{gather} a \\ b \end{gather}", True, "t"))
  assert [td.get("columnalign") for td in gathered.iter(M + "mtd")] == ["center", "center"]
  cases = hook.to_mathml(r"|x| = \begin{cases} x & x > 0 \\ -x & x \le 0 \end{cases}", True, "t")
  assert not _problems(cases) and cases.count("<mtr>") == 2  # latex2mathml's own tables stay


def test_arg_min_and_operatorname_render_as_operators(hook):
  root = ET.fromstring(hook.to_mathml(r"\arg\min_x f(x) + \arg z", False, "test"))
  operators = [_text(mo) for mo in root.iter(M + "mo")]
  assert "arg\u2009min" in operators and "arg" in operators
  root = ET.fromstring(hook.to_mathml(r"\operatorname{prox}_{\eta}(v)", False, "test"))
  assert "prox" in [_text(mo) for mo in root.iter(M + "mo")]
  for latex in (r"\arg\max_u g", r"\argmin_x f", r"\operatorname{prox}(v)"):
    assert "\\" not in _text(ET.fromstring(hook.to_mathml(latex, True, "test")))


def test_text_keeps_its_escaped_characters(hook):
  root = ET.fromstring(hook.to_mathml(r"\texttt{personal\_steps} \text{ a < b \& c}", False, "t"))
  assert _text(root) == "personal_steps\u00a0a\u00a0<\u00a0b\u00a0&\u00a0c"


def test_the_checks_fail_on_the_old_rendering(hook):
  """latex2mathml alone (the hook before this fix) gives what the checks reject: a raw ``&``
  (not XML) for an alignment, ``<mi>\\arg</mi>``, a ``\\_`` kept in text."""
  import latex2mathml.converter

  bad = (
    r"\begin{aligned} a &= b \\ c &= d \end{aligned}",
    r"\arg\min_x f(x)",
    r"\texttt{personal\_steps}",
  )
  for latex in bad:
    old = latex2mathml.converter.convert(latex, display="block")
    assert _problems(old), latex
    with pytest.raises(ValueError):
      hook.check(old)
    assert not _problems(hook.to_mathml(latex, True, "test"))
  assert _problems("<math><mi>&amp;</mi></math>") and not _problems("<math><mi>a</mi></math>")


def test_an_unrenderable_formula_fails_the_build(hook):
  with pytest.raises(ValueError, match="page.md"):
    hook.to_mathml(r"\begin{aligned} a &= b", True, "page.md")  # no \end{aligned}
  with pytest.raises(ValueError, match="raw text"):
    hook.to_mathml(r"\unknowncommand x", True, "page.md")


def _formulas():
  """``[(page, latex)]`` of every formula written in the docs (code blocks skipped)."""
  formulas = []
  for path in sorted(DOCS.rglob("*.md")):
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    formulas += [(path.name, m) for m in re.findall(r"\\\[(.+?)\\\]", text, flags=re.S)]
    formulas += [(path.name, m) for m in re.findall(r"\\\((.+?)\\\)", text, flags=re.S)]
  return formulas


def test_every_formula_of_the_docs_renders(hook):
  """Without a build: every formula of the docs through the hook, checked as in the site."""
  formulas = _formulas()
  assert len(formulas) > 150
  bad = {}
  for where, latex in formulas:
    if problems := _problems(hook.to_mathml(latex, True, where)):
      bad[latex] = problems
  assert bad == {}
  aligned = [latex for _, latex in formulas if "aligned" in latex]
  assert len(aligned) >= 10 and all(
    "<mtable" in hook.to_mathml(latex, True, "docs") for latex in aligned
  )


@pytest.fixture(scope="module")
def site(tmp_path_factory):
  """The built site (strict mode), once for this module: about 10 s."""
  pytest.importorskip("mkdocs")
  for plugin in ("material", "mkdocstrings_handlers.python", "mkdocs_jupyter", "latex2mathml"):
    pytest.importorskip(plugin)
  out_dir = tmp_path_factory.mktemp("site")
  out = subprocess.run(
    [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out_dir)],
    cwd=ROOT,
    capture_output=True,
    text=True,
    env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
  )
  assert out.returncode == 0, out.stderr[-4000:]
  return out_dir


@pytest.mark.slow  # builds the site (CI's strict docs build runs the hook's check too)
def test_every_math_element_of_the_built_site_is_well_formed(site):
  pages = sorted(site.rglob("*.html"))
  formulas, bad = 0, {}
  for page in pages:
    for mathml in re.findall(r"<math\b.*?</math>", page.read_text(), flags=re.S):
      formulas += 1
      if problems := _problems(mathml):
        bad.setdefault(str(page.relative_to(site)), []).append((problems, mathml[:200]))
  assert formulas > 150 and bad == {}
  for name in ALGORITHM_PAGES:
    html = (site / name / "index.html").read_text()
    assert "<mtable" in html and "\\arg" not in html and "<mi>&amp;</mi>" not in html
  # the 12 formulas that were broken: tables (10) and arg-min operators (2 without a table)
  text = "".join((site / name / "index.html").read_text() for name in ALGORITHM_PAGES)
  assert text.count('<mtable class="math-aligned"') >= 10
  assert text.count("arg&#x02009;min") + text.count("arg&#x02009;max") >= 5


@pytest.mark.slow  # builds the site (CI's strict docs build runs the hook's check too)
def test_display_math_scrolls_inside_the_content_column(site):
  css = (site / "stylesheets" / "math.css").read_text()
  rule = re.search(r"\.math-display\s*\{([^}]*)\}", css).group(1)
  assert re.search(r"overflow-x:\s*auto", rule) and re.search(r"max-width:\s*100%", rule)
  for name in ALGORITHM_PAGES:
    html = (site / name / "index.html").read_text()
    assert "stylesheets/math.css" in html
    blocks = re.findall(r'(.{0,40})<math [^>]*display="block"', html)
    assert blocks and all(b.endswith('<div class="math-display">') for b in blocks)


def _png_pixels_vary(data):
  """Whether the PNG ``data`` holds more than one colour, roughly: its decompressed scanlines
  (filter bytes included) use more than a few distinct byte values. A blank page gives 0 and
  one colour value (255 for white) or a handful with the sub/up filters."""
  assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
  pos, idat = 8, b""
  while pos < len(data):
    (length,) = struct.unpack(">I", data[pos : pos + 4])
    kind = data[pos + 4 : pos + 8]
    if kind == b"IDAT":
      idat += data[pos + 8 : pos + 8 + length]
    pos += 12 + length
  return len(set(zlib.decompress(idat))) > 8


def _png(width, height, pixel_of):
  """A small RGB PNG (for testing ``_png_pixels_vary``)."""
  rows = b"".join(
    b"\x00" + b"".join(bytes(pixel_of(x, y)) for x in range(width)) for y in range(height)
  )

  def chunk(kind, body):
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

  header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
  return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows))


def test_the_blank_screenshot_check_can_fail():
  assert not _png_pixels_vary(_png(40, 30, lambda x, y: (255, 255, 255)))
  assert _png_pixels_vary(_png(40, 30, lambda x, y: (x * 6, y * 8, (x * y) % 256)))


def _chromium():
  return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.parametrize("page", ["index.html", *(f"{p}/index.html" for p in ALGORITHM_PAGES)])
def test_pages_render_in_headless_chromium(request, page, tmp_path):
  browser = _chromium()
  if browser is None:
    pytest.skip("no chromium or chromium-browser on PATH")
  site = request.getfixturevalue("site")  # built only where a browser can show it
  shot = tmp_path / "page.png"
  subprocess.run(
    [
      browser,
      "--headless",
      "--no-sandbox",
      "--disable-gpu",
      "--hide-scrollbars",
      "--window-size=1280,2400",
      f"--screenshot={shot}",
      (site / page).as_uri(),
    ],
    capture_output=True,
    timeout=120,
    check=False,
  )
  assert shot.is_file() and shot.stat().st_size > 1000, f"no screenshot of {page}"
  assert _png_pixels_vary(shot.read_bytes()), f"the screenshot of {page} is blank"
