//! The stack as a client sees it: authenticated clients of each service, and jobs submitted,
//! read, stopped and waited for.

use super::*;

impl Stack {
    pub async fn jobs(&self) -> JobServiceClient<Authed> {
        self.jobs_as(&self.token).await
    }

    pub async fn jobs_as(&self, token: &str) -> JobServiceClient<Authed> {
        JobServiceClient::with_interceptor(Self::channel(self.api_addr).await, BearerInterceptor::new(token))
    }

    pub async fn artifacts(&self) -> ArtifactServiceClient<Authed> {
        self.artifacts_as(&self.token).await
    }

    pub async fn artifacts_as(&self, token: &str) -> ArtifactServiceClient<Authed> {
        ArtifactServiceClient::with_interceptor(Self::channel(self.api_addr).await, BearerInterceptor::new(token))
    }

    pub async fn datasets(&self) -> DatasetServiceClient<Authed> {
        self.datasets_as(&self.token).await
    }

    pub async fn datasets_as(&self, token: &str) -> DatasetServiceClient<Authed> {
        DatasetServiceClient::with_interceptor(Self::channel(self.api_addr).await, BearerInterceptor::new(token))
    }

    pub async fn models(&self) -> ModelServiceClient<Authed> {
        self.models_as(&self.token).await
    }

    pub async fn models_as(&self, token: &str) -> ModelServiceClient<Authed> {
        ModelServiceClient::with_interceptor(Self::channel(self.api_addr).await, BearerInterceptor::new(token))
    }

    pub async fn secrets(&self) -> SecretServiceClient<Authed> {
        SecretServiceClient::with_interceptor(Self::channel(self.api_addr).await, BearerInterceptor::new(&self.token))
    }

    pub async fn logs_client(&self) -> LogServiceClient<Authed> {
        self.logs_as(&self.token).await
    }

    pub async fn logs_as(&self, token: &str) -> LogServiceClient<Authed> {
        LogServiceClient::with_interceptor(Self::channel(self.logs_addr).await, BearerInterceptor::new(token))
    }

    /// Submits a job without code.
    pub async fn submit(&self, command: &[&str]) -> pb::Job {
        self.submit_spec(spec(command)).await
    }

    pub async fn submit_spec(&self, spec: pb::JobSpec) -> pb::Job {
        let response = self.try_submit(spec).await;
        response.expect("submit").into_inner().job.expect("job")
    }

    /// Submits `spec`, answering what the api answered.
    pub async fn try_submit(&self, spec: pb::JobSpec) -> Result<tonic::Response<pb::SubmitJobResponse>, tonic::Status> {
        self.jobs()
            .await
            .submit_job(pb::SubmitJobRequest {
                spec: Some(spec),
                ..Default::default()
            })
            .await
    }

    pub async fn get(&self, job_id: &str) -> pb::Job {
        self.jobs()
            .await
            .get_job(pb::GetJobRequest { job_id: job_id.into() })
            .await
            .expect("get")
            .into_inner()
    }

    /// Stops a job and waits until it is STOPPED.
    pub async fn stop_job(&self, job_id: &str) -> pb::Job {
        self.jobs()
            .await
            .stop_job(pb::StopJobRequest { job_id: job_id.into() })
            .await
            .expect("stop");
        self.wait_for_state(job_id, pb::JobState::Stopped).await
    }

    /// Waits until the job satisfies `done`, panicking with the job after [`PATIENCE`].
    pub async fn wait_for(&self, job_id: &str, what: &str, done: impl Fn(&pb::Job) -> bool) -> pb::Job {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let job = self.get(job_id).await;
            if done(&job) {
                return job;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}: {job:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn wait_for_state(&self, job_id: &str, state: pb::JobState) -> pb::Job {
        self.wait_for(job_id, state.as_str_name(), |job| job.state == state as i32)
            .await
    }

    /// Reads all of a job's log lines (following until the job ends when `follow`).
    pub async fn log_lines(&self, job_id: &str, follow: bool) -> Vec<pb::LogLine> {
        use futures::StreamExt;
        let request = pb::GetLogsRequest {
            job_id: job_id.into(),
            follow,
            ..Default::default()
        };
        let mut stream = self
            .logs_client()
            .await
            .get_logs(request)
            .await
            .expect("get logs")
            .into_inner();
        let mut lines = Vec::new();
        while let Some(line) = tokio::time::timeout(PATIENCE, stream.next())
            .await
            .expect("log stream stalled")
        {
            lines.push(line.expect("log line"));
        }
        lines
    }
}
