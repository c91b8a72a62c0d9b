"""Reading rendered pages as a browser would, with the standard library's HTML parser:
the values a POST form sends (``PostForm``), the links and POST actions a page offers
(``page_actions``), and the text of the elements with given attributes (``texts``)."""

from dataclasses import dataclass, field
from html.parser import HTMLParser

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
        "track", "wbr"}  # fmt: skip


class PostForm(HTMLParser):
    """The values a browser sends for the page's POST form to ``action``: enabled inputs
    (checkboxes when checked), each select's selected option (else its first), textareas
    (without the one line break after the tag that browsers drop). Also the labels of the
    fields the browser requires that have no value yet."""

    def __init__(self, action: str):
        super().__init__(convert_charrefs=True)
        self.action = action
        self.values: dict[str, str] = {}
        self.labels: dict[str, str] = {}  # field id -> label text
        self.required_ids: dict[str, str] = {}  # field id -> name, of required fields
        self._in_form = False
        self._select: str | None = None
        self._first_option: str | None = None
        self._textarea: str | None = None
        self._label_for: str | None = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "form":
            self._in_form = attrs.get("method") == "post" and attrs.get("action") == self.action
        if tag == "label" and attrs.get("for"):
            self._label_for = attrs["for"]
            self.labels[self._label_for] = ""
        if not self._in_form or "disabled" in attrs:
            return
        name = attrs.get("name")
        if name and "required" in attrs and attrs.get("id"):
            self.required_ids[attrs["id"]] = name
        if tag == "input" and name:
            if attrs.get("type") in ("checkbox", "radio") and "checked" not in attrs:
                return
            if attrs.get("type") not in ("submit", "button"):
                self.values[name] = attrs.get("value", "")
        elif tag == "select" and name:
            self._select, self._first_option = name, None
        elif tag == "option" and self._select:
            value = attrs.get("value", "")
            if self._first_option is None:
                self._first_option = value
            if "selected" in attrs:
                self.values[self._select] = value
        elif tag == "textarea" and name:
            self._textarea = name
            self.values[name] = ""

    def handle_endtag(self, tag):
        if tag == "form":
            self._in_form = False
        elif tag == "label":
            self._label_for = None
        elif tag == "select" and self._select:
            self.values.setdefault(self._select, self._first_option or "")
            self._select = None
        elif tag == "textarea" and self._textarea:
            value = self.values[self._textarea]
            self.values[self._textarea] = value[1:] if value.startswith("\n") else value
            self._textarea = None

    def handle_data(self, data):
        if self._textarea:
            self.values[self._textarea] += data
        if self._label_for:
            self.labels[self._label_for] += data

    def fields_without_value(self) -> set[str]:
        return {
            self.label(field_id)
            for field_id, name in self.required_ids.items()
            if not self.values.get(name, "").strip()
        }

    def label(self, field_id: str) -> str:
        return self.labels[field_id].strip().removesuffix("*").strip()


def post_form(html: str, action: str) -> PostForm:
    form = PostForm(action)
    form.feed(html)
    return form


@dataclass
class PageActions(HTMLParser):
    """Every link (``a href``) and every POST form's action of a page, in page order."""

    links: list[str] = field(default_factory=list)
    posts: list[str] = field(default_factory=list)

    def __post_init__(self):
        super().__init__(convert_charrefs=True)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "a" and attrs.get("href"):
            self.links.append(attrs["href"])
        elif tag == "form" and (attrs.get("method") or "get").lower() == "post":
            self.posts.append(attrs.get("action") or "")


def page_actions(html: str) -> PageActions:
    actions = PageActions()
    actions.feed(html)
    return actions


class _Texts(HTMLParser):
    def __init__(self, attrs: dict[str, str]):
        super().__init__(convert_charrefs=True)
        self.wanted = attrs
        self.found: list[list[str]] = []
        self._open: list[tuple[int, int]] = []  # open matches: (depth, index in found)
        self._depth = 0

    def handle_starttag(self, tag, attrs):
        if tag in VOID:
            return
        self._depth += 1
        if all(dict(attrs).get(name) == value for name, value in self.wanted.items()):
            self._open.append((self._depth, len(self.found)))
            self.found.append([])

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        if self._open and self._open[-1][0] == self._depth:
            self._open.pop()
        self._depth -= 1

    def handle_data(self, data):
        for _, index in self._open:
            self.found[index].append(data)


def texts(html: str, **attrs: str) -> list[str]:
    """The text of every element whose attributes have these values (``data_home=`` for
    ``data-home``): its text nodes joined by a space, whitespace collapsed."""
    parser = _Texts({name.replace("_", "-"): value for name, value in attrs.items()})
    parser.feed(html)
    return [" ".join(" ".join(parts).split()) for parts in parser.found]
