"""`ctxprec view`: a local web server over one output (or two, compared) that serves its report
and its whole row table, page by page, read only."""

from ctxprec.view.server import build_app, is_loopback, report_problem, serve, url_of

__all__ = ["build_app", "is_loopback", "report_problem", "serve", "url_of"]
