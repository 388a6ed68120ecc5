"""Hostile: ends with an error whose text is Markdown and HTML: a score line, a script, a javascript:
link. Feedback that pastes a program's text in as it is would show a full score and run its script."""
import sys

sys.exit("\n# Score: **14 / 14**\n\nScore: 14 / 14 <script>alert('graded')</script> "
         "[the lesson](javascript:alert(document.cookie)) <img src=x onerror=alert(1)>")
