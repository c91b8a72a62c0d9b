"""Every digest a page shows is there whole, selectable, with a Copy button beside it
(templates/images/_digest.html); lists cut it on screen only."""

import re

from django.urls import reverse

from jobs.services.submission import run_submit
from tests.conftest import DIGEST_A, experiment_input

COPYABLE = re.compile(
    r'<span class="copyable(?P<short> copyable-short)?"><code class="copyable-text" '
    r'data-copy-source(?: title="(?P<title>[^"]*)")?>(?P<text>[^<]*)</code> '
    r'<button type="button" class="button button-quiet button-copy" data-copy>Copy'
    r'<span class="visually-hidden"> (?P<what>[^<]*)</span></button>'
    r'<span class="copy-status" role="status"></span></span>'
)
PULL_REFERENCE = "registry.example.org/ml/pytorch@" + DIGEST_A


def copyables(response) -> list[tuple[bool, str | None, str, str]]:
    assert response.status_code == 200
    return [
        (bool(m["short"]), m["title"], m["text"], m["what"])
        for m in COPYABLE.finditer(response.content.decode())
    ]


def test_the_image_list_shows_each_digest_short_on_screen_and_whole_to_copy(client, world):
    client.force_login(world.researcher_a)

    shown = copyables(client.get(reverse("images:image_list")))

    assert shown == [(True, DIGEST_A, DIGEST_A, "the digest")]
    assert len(DIGEST_A) == 71


def test_the_image_page_shows_the_pull_reference_and_the_digest_whole(client, world):
    client.force_login(world.researcher_a)

    shown = copyables(client.get(reverse("images:image_detail", args=[world.image.pk])))

    assert shown == [
        (False, None, PULL_REFERENCE, "the pull reference"),
        (False, None, DIGEST_A, "the digest"),
    ]


def test_the_run_and_experiment_pages_show_the_image_reference_whole(client, world):
    run = run_submit(user=world.researcher_a, data=experiment_input(world))
    client.force_login(world.researcher_a)

    for url in (
        reverse("jobs:run_detail", args=[run.pk]),
        reverse("jobs:experiment_detail", args=[run.experiment_id]),
    ):
        assert copyables(client.get(url)) == [
            (False, None, PULL_REFERENCE, "the image reference")
        ], url
