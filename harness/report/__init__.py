"""The report stage: verdicts and studies written for people (terminal table, Markdown, HTML, JUnit,
plots). Imports the base modules and verdict's types; never run, observe or commands."""
