"""What type checkers and editors see of `trtbuild` (its `__init__.py` imports lazily)."""

from trtbuild.api import build as build
from trtbuild.api import check as check
from trtbuild.api import convert as convert
from trtbuild.api import open_cache as open_cache
from trtbuild.api import tune as tune
from trtbuild.errors import BackendError as BackendError
from trtbuild.errors import TrtbuildError as TrtbuildError
from trtbuild.errors import UsageError as UsageError
from trtbuild.policy import Policy as Policy
from trtbuild.policy import PolicySource as PolicySource
from trtbuild.policy import load_policy as load_policy
from trtbuild.policy.specs import Match as Match
from trtbuild.policy.specs import Rule as Rule
from trtbuild.results import AtRisk as AtRisk
from trtbuild.results import BuildResult as BuildResult
from trtbuild.results import CheckedPoint as CheckedPoint
from trtbuild.results import CheckResult as CheckResult
from trtbuild.results import Divergence as Divergence
from trtbuild.results import FlippedDecision as FlippedDecision
from trtbuild.results import NodeDecision as NodeDecision
from trtbuild.results import OutputResult as OutputResult
from trtbuild.results import Pin as Pin
from trtbuild.results import PointResult as PointResult
from trtbuild.results import SkippedPoint as SkippedPoint
from trtbuild.results import TuneResult as TuneResult

__version__: str
__all__: list[str]
