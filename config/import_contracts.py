"""The public-surface rule as an import-linter contract type (``public_surface``).

import-linter's own contracts say which packages may import which; none says "other apps may import
only these modules of an app". This one does: an import from one app into another must land on a
module that the contract lists as public (an app's services, selectors and models, and a few named
modules), so a new private module is covered the day it is written. Configured in pyproject.toml.
"""

from __future__ import annotations

import grimp
from importlinter import Contract, ContractCheck, fields, output
from importlinter.application import contract_utils
from importlinter.domain import helpers


class PublicSurfaceContract(Contract):
    """Imports between ``apps`` reach only ``public_modules``; ``exempt_importers`` (tests,
    migrations) and ``ignore_imports`` are left out, and every ignored import must still exist."""

    type_name = "public_surface"

    apps = fields.ListField(subfield=fields.StringField())
    public_modules = fields.ListField(subfield=fields.ModuleExpressionField())
    exempt_importers = fields.ListField(subfield=fields.ModuleExpressionField(), required=False)
    ignore_imports = fields.SetField(subfield=fields.ImportExpressionField(), required=False)
    unmatched_ignore_imports_alerting = fields.EnumField(
        contract_utils.AlertLevel, default=contract_utils.AlertLevel.ERROR
    )

    def check(self, graph: grimp.ImportGraph, verbose: bool) -> ContractCheck:
        """Every direct import from one app into another whose target is not public."""
        removal = contract_utils.remove_ignored_imports_and_report(
            graph=graph,
            ignore_imports=self.ignore_imports,  # type: ignore[arg-type]
            unmatched_alerting=self.unmatched_ignore_imports_alerting,  # type: ignore[arg-type]
        )
        apps = set(self.apps)  # type: ignore[call-overload]
        public = self._modules(graph, self.public_modules)
        exempt = self._modules(graph, self.exempt_importers or [])
        illegal = []
        for importer in sorted(graph.modules):
            app = importer.split(".")[0]
            if app not in apps or importer in exempt:
                continue
            for imported in sorted(graph.find_modules_directly_imported_by(importer)):
                target_app = imported.split(".")[0]
                if target_app in apps and target_app != app and imported not in public:
                    details = graph.get_import_details(importer=importer, imported=imported)
                    lines = sorted({detail["line_number"] for detail in details})
                    illegal.append({"importer": importer, "imported": imported, "lines": lines})
        return ContractCheck(
            kept=not illegal,
            warnings=list(removal.warnings),
            ignored_import_count=removal.ignored_import_count,
            metadata={"illegal": illegal},
        )

    def render_broken_contract(self, check: ContractCheck) -> None:
        """One line per import of another app's private module, with its line numbers."""
        output.print_error("Other apps' private modules imported:", bold=False)
        output.new_line()
        for link in check.metadata["illegal"]:
            lines = ", ".join(map(str, link["lines"]))
            text = f"- {link['importer']} -> {link['imported']} (l.{lines})"
            output.print_error(text, bold=False)
        output.new_line()
        output.print(
            "Import the app's services, selectors or models instead "
            "(move the name there, or expose it there)."
        )

    @staticmethod
    def _modules(graph: grimp.ImportGraph, expressions: object) -> set[str]:
        found = helpers.module_expressions_to_modules(graph, expressions)  # type: ignore[arg-type]
        return {module.name for module in found}
