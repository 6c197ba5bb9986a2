# SPDX-License-Identifier: GPL-3.0-or-later
"""`gpuharden report FILE.json`: the table or the HTML page of a drift report already written (by `gpuharden drift
--report`, with or without --slice, or `gpuharden drift-merge --report`), with no run and no host contacted.

The table is drift's (terminal.render through drift_terminal.table), the page drift --html's (report_html.render), and the exit
code drift's for the report's state (drift_report.exit_code): one renderer and one exit decision for a run and for its file.
"""

from __future__ import annotations

import argparse
import json
import sys

from gpuharden import drift_report, drift_slices, drift_terminal, terminal

DESCRIPTION = """\
Render a JSON report that gpuharden drift (with or without --slice) or gpuharden drift-merge wrote: the terminal
table that drift prints (--table, the default without --html) and/or the self-contained HTML page of drift --html
(--html: problems first, clean nodes collapsed, a filter by status and by check, a search by node name, findings by
id).  Nothing is run and no host is contacted: the report says what its run saw, when it ran.
"""
EPILOG = """\
examples:
  gpuharden report /var/lib/gpuharden/drift-report.json --html fleet.html
  gpuharden report slice-2.json --table
  fleet.html#status=drift&check=kubelet&q=gpu-0    opens the page with that filter (the filter's controls set it)

exit codes (as gpuharden drift's for the run the report describes):
  0    the report is clean: every node answered and is clean, no cluster finding
  1    a node drifted or needs attention, or a cluster finding
  4    the run could not check something it was asked to (a blind cluster side, a node check, a node unreachable
       or failed)
  2    the file could not be read, is not a drift report of this schema version, or --html could not be written:
       nothing written
"""
# What a report from another source (edited by hand, cut short, another tool's) may lack where the renderers look.
MALFORMED = (KeyError, IndexError, TypeError, AttributeError, ValueError)


class ReportFileError(Exception):
    """A report file this command cannot render; the message names the file."""


def load(path):
    """The drift report in ``path``, or the ReportFileError naming the file and why."""
    try:
        report = drift_slices.read_report(path)
    except drift_slices.MergeError as error:
        raise ReportFileError(str(error)) from None
    error = drift_slices.report_error(path, report)
    if error:
        raise ReportFileError(str(error))
    error = check_shape(path, report)
    if error:
        raise error
    return report


# What the table and the page read of a report, by type: a report edited by hand or cut short is refused naming the
# field, before anything is rendered.
NUMBER = (int, float)
SUMMARY_COUNTS = ("nodes", "clean", "drifted", "unreachable", "failed", "findings")
NODE_FIELDS = (("status", str), ("findings", list), ("remediable_stages", list))
FINDING_FIELDS = (("id", str), ("check", str), ("severity", str))
PART_FIELDS = ("not_checked", "refused")


def _type_name(kinds):
    names = {str: "a string", list: "a list", dict: "an object", int: "a number", float: "a number", bool: "true or false"}
    return " or ".join(dict.fromkeys(names[kind] for kind in (kinds if isinstance(kinds, tuple) else (kinds,))))


def _field_error(path, where, container, key, kinds):
    """The ReportFileError for ``container[key]`` missing or not of ``kinds``, else None."""
    if not isinstance(container, dict) or key not in container:
        return ReportFileError("%s: %s is missing" % (path, where))
    value = container[key]
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in (kinds if isinstance(kinds, tuple) else (kinds,))):
        return ReportFileError("%s: %s is %s, not %s" % (path, where, json.dumps(value)[:80], _type_name(kinds)))
    return None


def _shape_errors(path, report):
    yield _field_error(path, "fail_severity", report, "fail_severity", str)
    yield _field_error(path, "duration_seconds", report, "duration_seconds", NUMBER)
    for key in SUMMARY_COUNTS:
        yield _field_error(path, "summary.%s" % key, report["summary"], key, int)
    for host, node in report["nodes"].items():
        if not isinstance(node, dict):
            yield ReportFileError("%s: nodes.%s is %s, not an object" % (path, host, json.dumps(node)[:80]))
            continue
        for key, kind in NODE_FIELDS:
            yield _field_error(path, "nodes.%s.%s" % (host, key), node, key, kind)
        for index, entry in enumerate(node.get("findings") if isinstance(node.get("findings"), list) else []):
            if not isinstance(entry, dict):
                yield ReportFileError("%s: nodes.%s.findings[%d] is %s, not an object" % (path, host, index, json.dumps(entry)[:80]))
                continue
            for key, kind in FINDING_FIELDS:
                yield _field_error(path, "nodes.%s.findings[%d].%s" % (host, index, key), entry, key, kind)
        for key in PART_FIELDS:
            if key in node:
                yield _field_error(path, "nodes.%s.%s" % (host, key), node, key, list)


def check_shape(path, report):
    """The first ReportFileError of a report whose fields the table and the page read are missing or of another type."""
    return next((error for error in _shape_errors(path, report) if error), None)


def _malformed(path, error):
    what = "missing field %s" % error if isinstance(error, KeyError) else "%s: %s" % (type(error).__name__, error)
    return ReportFileError("%s is not a gpuharden drift report the table and page can show (%s)" % (path, what))


def render(path, report, *, html=False, table=False, width=terminal.DEFAULT_WIDTH):
    """(exit code, page or None, table or None) of a loaded report; a field missing or of the wrong type is the
    ReportFileError naming the file, before anything is written."""
    try:
        code = drift_report.exit_code(report)
        page = None
        if html:
            from gpuharden import report_html  # noqa: PLC0415 (only --html needs it)

            page = report_html.render(report)
        text = drift_terminal.table(report, width) if table else None
    except MALFORMED as error:
        raise _malformed(path, error) from None
    return code, page, text


def main(args, out=None):
    out = out or sys.stdout
    show_table = args.table or not args.html
    try:
        report = load(args.report)
        code, page, text = render(args.report, report, html=bool(args.html), table=show_table,
                                  width=None if args.wide else terminal.terminal_width())
        if page is not None:
            drift_report.write_atomically(args.html, page)
    except ReportFileError as error:
        print("gpuharden report: %s; nothing written" % error, file=sys.stderr)
        return drift_report.EXIT_USAGE
    except OSError as error:
        print("gpuharden report: %s" % error, file=sys.stderr)
        return drift_report.EXIT_USAGE
    if text is not None:
        out.write(text + "\n")
    return code


def add_parser(commands):
    parser = commands.add_parser("report", help="render a JSON drift report as the table or the HTML page, without running anything",
                                 description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("report", metavar="FILE.json", help="a report of gpuharden drift --report (with or without --slice) or drift-merge")
    parser.add_argument("--html", metavar="OUT.html", help="write the self-contained HTML page here")
    parser.add_argument("--table", action="store_true", help="print the table gpuharden drift prints (the default without --html)")
    parser.add_argument("--wide", action="store_true", help="do not wrap the table to the terminal's width (COLUMNS)")
    parser.set_defaults(handler=main)
    return parser
