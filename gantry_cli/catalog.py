"""What your tenants may use: ``gantry quota`` and ``gantry images``, and their parsers."""

from gantry_cli.arguments import Commands, add_command, add_json_flag
from gantry_cli.context import Context
from gantry_cli.errors import EXIT_OK
from gantry_cli.output import print_json, table


def cmd_quota(ctx: Context) -> int:
    params = {"tenant": ctx.args.tenant} if ctx.args.tenant else {}
    quotas = ctx.client().get_all("quotas/", params)
    if ctx.args.json:
        print_json(quotas)
        return EXIT_OK
    if not quotas:
        print("No quotas.")
        return EXIT_OK
    rows = [
        (
            q["tenant"],
            q["flavor"],
            q["guaranteed_gpus"],
            q["borrow_limit_gpus"],
            q["in_use"],
            q["borrowable"],
            q["gpu_hours"],
            q["monthly_gpu_hour_budget"],
            q["burn_percent"],
        )
        for q in quotas
    ]
    headers = (
        "TENANT",
        "FLAVOR",
        "GUARANTEED",
        "BORROW_LIMIT",
        "IN_USE",
        "BORROWABLE",
        "GPU_HOURS",
        "BUDGET",
        "BURN_%",
    )
    print(table(headers, rows))
    return EXIT_OK


def cmd_images(ctx: Context) -> int:
    images = ctx.client().get_all("images/")
    if ctx.args.json:
        print_json(images)
        return EXIT_OK
    if not images:
        print("No images.")
        return EXIT_OK
    rows = [
        (
            image["id"],
            f"{image['repository']}:{image['tag']}" if image["tag"] else image["repository"],
            image["digest"],
            image["cuda_version"],
            " ".join(f"{name}={version}" for name, version in image["frameworks"].items()),
        )
        for image in images
    ]
    print(table(("ID", "IMAGE", "DIGEST", "CUDA", "FRAMEWORKS"), rows))
    return EXIT_OK


def add_catalog_commands(commands: Commands) -> None:
    quota = add_command(commands, "quota", cmd_quota, "Quotas of your tenants and what they use.")
    quota.add_argument("--tenant", help="Only this tenant (slug)")
    add_json_flag(quota)

    images = add_command(commands, "images", cmd_images, "Images you may run.")
    add_json_flag(images)
