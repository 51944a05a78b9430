//! The access rule of every gRPC method of every kiln service. A method without a rule is
//! refused; a test checks that this table and the proto descriptors name the same methods.

use super::JobAccess::{Allow, Deny, OwnBatch, OwnJob};
use super::Need::{Admin, Caller, OwnerOr, Role as Needs};
use super::Role::{Maintainer, Member, Viewer};
use super::{Need, Rule};

/// Own objects need `member`, other users' `maintainer`.
const MEMBER_OWN_MAINTAINER_ANY: Need = OwnerOr {
    owner: Member,
    others: Maintainer,
};

const fn rule(method: &'static str, need: Need, job: super::JobAccess) -> Rule {
    Rule { method, need, job }
}

/// Every method's rule, by service.
pub const POLICY: &[Rule] = &[
    // api: jobs
    rule("/kiln.v1.JobService/SubmitJob", Needs(Member), Deny),
    rule("/kiln.v1.JobService/GetJob", Needs(Viewer), OwnJob),
    rule("/kiln.v1.JobService/ListJobs", Needs(Viewer), Deny),
    rule("/kiln.v1.JobService/StopJob", MEMBER_OWN_MAINTAINER_ANY, Deny),
    rule("/kiln.v1.JobService/WatchJob", Needs(Viewer), OwnJob),
    rule("/kiln.v1.JobService/WatchJobs", Needs(Viewer), Deny),
    rule("/kiln.v1.JobService/CreateRun", Needs(Member), Deny),
    rule("/kiln.v1.JobService/FinishRun", MEMBER_OWN_MAINTAINER_ANY, OwnJob),
    rule("/kiln.v1.JobService/ExplainJob", Needs(Viewer), OwnJob),
    // (a run's config and summary: its own job token sets them from `kiln.init`/`kiln.summary`)
    rule("/kiln.v1.JobService/UpdateRun", MEMBER_OWN_MAINTAINER_ANY, OwnJob),
    // api: quotas (a project's by its maintainer; users' and the global one by the admin)
    rule("/kiln.v1.QuotaService/SetQuota", Needs(Maintainer), Deny),
    rule("/kiln.v1.QuotaService/GetQuota", Needs(Viewer), Deny),
    // (a listing of what the caller may read: the global quota, their own, their projects')
    rule("/kiln.v1.QuotaService/ListQuotas", Caller, Deny),
    rule("/kiln.v1.QuotaService/DeleteQuota", Needs(Maintainer), Deny),
    // api: content-addressed blobs of projects (code bundles, and what `kiln.save` uploads from
    // inside a job, to the job's project), a job's outputs and the artifacts a run saved
    rule("/kiln.v1.ArtifactService/StatArtifact", Needs(Viewer), Allow),
    rule("/kiln.v1.ArtifactService/UploadArtifact", Needs(Member), Allow),
    rule("/kiln.v1.ArtifactService/ListOutputs", Needs(Viewer), OwnJob),
    rule("/kiln.v1.ArtifactService/GetOutput", Needs(Viewer), OwnJob),
    rule(
        "/kiln.v1.ArtifactService/SaveRunArtifact",
        MEMBER_OWN_MAINTAINER_ANY,
        OwnJob,
    ),
    rule("/kiln.v1.ArtifactService/ListRunArtifacts", Needs(Viewer), OwnJob),
    rule("/kiln.v1.ArtifactService/GetRunArtifact", Needs(Viewer), OwnJob),
    // api: datasets
    rule("/kiln.v1.DatasetService/CreateDataset", Needs(Member), Deny),
    rule("/kiln.v1.DatasetService/ListDatasets", Needs(Viewer), Deny),
    rule("/kiln.v1.DatasetService/DeleteDataset", MEMBER_OWN_MAINTAINER_ANY, Deny),
    // api: the model registry (a model is of its source job's project: viewers read; members
    // register from the project's jobs, tag versions and move aliases; a job may register its own
    // outputs)
    rule("/kiln.v1.ModelService/RegisterModel", Needs(Member), OwnJob),
    rule("/kiln.v1.ModelService/GetModel", Needs(Viewer), Deny),
    rule("/kiln.v1.ModelService/ListModels", Needs(Viewer), Deny),
    rule("/kiln.v1.ModelService/GetModelVersion", Needs(Viewer), Deny),
    rule("/kiln.v1.ModelService/ListModelVersions", Needs(Viewer), Deny),
    rule("/kiln.v1.ModelService/SetModelAlias", Needs(Member), Deny),
    rule("/kiln.v1.ModelService/DeleteModelAlias", Needs(Member), Deny),
    rule("/kiln.v1.ModelService/SetModelTags", Needs(Member), Deny),
    rule("/kiln.v1.ModelService/GetModelFile", Needs(Viewer), Deny),
    // api: users and tokens
    rule("/kiln.v1.UserService/CreateUser", Admin, Deny),
    rule("/kiln.v1.UserService/ListUsers", Admin, Deny),
    rule("/kiln.v1.UserService/DisableUser", Admin, Deny),
    rule("/kiln.v1.UserService/CreateToken", Caller, Deny),
    // (a web UI login the caller approves for the browser showing the code: it binds their own login)
    rule("/kiln.v1.UserService/ApproveLogin", Caller, Deny),
    rule("/kiln.v1.UserService/ListTokens", Caller, Deny),
    rule("/kiln.v1.UserService/RevokeToken", Caller, Deny),
    // api: projects
    rule("/kiln.v1.ProjectService/CreateProject", Admin, Deny),
    rule("/kiln.v1.ProjectService/ListProjects", Caller, Deny),
    rule("/kiln.v1.ProjectService/ListMembers", Needs(Viewer), Deny),
    rule("/kiln.v1.ProjectService/AddMember", Needs(Maintainer), Deny),
    rule("/kiln.v1.ProjectService/RemoveMember", Needs(Maintainer), Deny),
    // api: secrets
    rule("/kiln.v1.SecretService/SetSecret", Needs(Maintainer), Deny),
    rule("/kiln.v1.SecretService/ListSecrets", Needs(Member), Deny),
    rule("/kiln.v1.SecretService/DeleteSecret", Needs(Maintainer), Deny),
    // every service
    rule("/kiln.v1.NodeService/WhoAmI", Caller, Allow),
    // api: where the other services are (a job's SDK asks too)
    rule("/kiln.v1.DiscoveryService/Discover", Caller, Allow),
    // log-ingest
    rule("/kiln.v1.LogService/GetLogs", Needs(Viewer), OwnJob),
    rule("/kiln.v1.LogService/TailLogs", Needs(Viewer), OwnJob),
    rule("/kiln.v1.LogService/WriteLogs", Needs(Member), OwnJob),
    rule("/kiln.v1.LogService/SearchLogs", Needs(Viewer), Deny),
    rule("/kiln.v1.LogService/WriteMetrics", Needs(Member), OwnJob),
    rule("/kiln.v1.LogService/WriteMetricsStream", Needs(Member), OwnJob),
    rule("/kiln.v1.LogService/QueryMetrics", Needs(Viewer), OwnJob),
    rule("/kiln.v1.LogService/ListMetricKeys", Needs(Viewer), OwnJob),
    rule("/kiln.v1.LogService/LatestMetrics", Needs(Viewer), OwnJob),
    rule("/kiln.v1.BatchLogService/SearchBatchLogs", Needs(Viewer), OwnBatch),
    // item-batch
    rule("/kiln.v1.BatchService/CreateBatch", Needs(Member), Deny),
    rule("/kiln.v1.BatchService/AddItems", MEMBER_OWN_MAINTAINER_ANY, Deny),
    rule(
        "/kiln.v1.BatchService/AddItemsFromObjects",
        MEMBER_OWN_MAINTAINER_ANY,
        Deny,
    ),
    rule("/kiln.v1.BatchService/SealBatch", MEMBER_OWN_MAINTAINER_ANY, Deny),
    rule("/kiln.v1.BatchService/CancelBatch", MEMBER_OWN_MAINTAINER_ANY, Deny),
    rule("/kiln.v1.BatchService/GetBatch", Needs(Viewer), OwnBatch),
    rule("/kiln.v1.BatchService/ListBatches", Needs(Viewer), Deny),
    rule("/kiln.v1.BatchService/WatchBatches", Needs(Viewer), Deny),
    rule("/kiln.v1.BatchService/ListItems", Needs(Viewer), OwnBatch),
    rule("/kiln.v1.BatchService/GetItemLogs", Needs(Viewer), OwnBatch),
    rule("/kiln.v1.BatchService/RetryFailed", MEMBER_OWN_MAINTAINER_ANY, Deny),
    // item-batch: the worker loop, for the batch's own workers (and users running an agent)
    rule("/kiln.v1.ItemWorkService/Work", MEMBER_OWN_MAINTAINER_ANY, OwnBatch),
    // advisor: sweeps (a trial's own token may ask whether it should stop)
    rule("/kiln.v1.SweepService/CreateSweep", Needs(Member), Deny),
    rule("/kiln.v1.SweepService/GetSweep", Needs(Viewer), Deny),
    rule("/kiln.v1.SweepService/ListSweeps", Needs(Viewer), Deny),
    rule("/kiln.v1.SweepService/WatchSweeps", Needs(Viewer), Deny),
    rule("/kiln.v1.SweepService/StopSweep", MEMBER_OWN_MAINTAINER_ANY, Deny),
    rule("/kiln.v1.SweepService/ResumeSweep", MEMBER_OWN_MAINTAINER_ANY, Deny),
    rule("/kiln.v1.SweepService/BestTrial", Needs(Viewer), Deny),
    rule("/kiln.v1.SweepService/ShouldStop", Needs(Viewer), OwnJob),
    // predictor: inference services
    rule("/kiln.v1.ServeService/CreateService", Needs(Member), Deny),
    rule("/kiln.v1.ServeService/GetService", Needs(Viewer), Deny),
    rule("/kiln.v1.ServeService/ListServices", Needs(Viewer), Deny),
    rule("/kiln.v1.ServeService/WatchServices", Needs(Viewer), Deny),
    rule("/kiln.v1.ServeService/UpdateService", MEMBER_OWN_MAINTAINER_ANY, Deny),
    rule("/kiln.v1.ServeService/ScaleService", MEMBER_OWN_MAINTAINER_ANY, Deny),
    rule("/kiln.v1.ServeService/StopService", MEMBER_OWN_MAINTAINER_ANY, Deny),
];
