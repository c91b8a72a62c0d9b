"""``gantry``: the command-line client of the Gantry API. Standard library and PyYAML only;
it never imports Django, so it installs and runs anywhere."""
