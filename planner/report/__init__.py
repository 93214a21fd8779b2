"""Reports: figures (matplotlib, imported lazily, Agg backend) and an index in Markdown and HTML.

`build_report(load_inputs(...), "reports/NAME")` writes `reports/NAME/figures/*.png|svg`,
`report.md` and a self-contained `report.html` from whichever inputs exist.
"""

from planner.report.build import FIGURES, FORMATS, Report, build_report, parse_formats, report_dir
from planner.report.inputs import ReportInputs, TimelineRow, load_inputs, read_timeline

__all__ = [
    "FIGURES",
    "FORMATS",
    "Report",
    "ReportInputs",
    "TimelineRow",
    "build_report",
    "load_inputs",
    "parse_formats",
    "read_timeline",
    "report_dir",
]
