variable "name" {
  description = "Name prefix."
  type        = string
}

variable "pool" {
  description = "The kiln pool these runners serve (`pool` in the runner's config)."
  type        = string
}

variable "cluster" {
  description = "The kiln cluster id (the provisioner's `cluster`): the launch template's kiln-cluster tag."
  type        = string
}

variable "launch_template_name" {
  description = "The launch template's name, known before it exists: the provisioner's config names it."
  type        = string
}

variable "region" {
  description = "The AWS region."
  type        = string
}

variable "gpu" {
  description = "GPU instances: the image has the NVIDIA driver and container toolkit, and docker runs GPU jobs with them."
  type        = bool
}

variable "cluster_placement" {
  description = "Make a cluster placement group (named like the launch template) for the pool's gangs to launch into."
  type        = bool
  default     = false
}

variable "ecr_repositories" {
  description = "ARNs of ECR repositories (arn:aws:ecr:REGION:ACCOUNT:repository/NAME) whose images every job of the pool pulls with the instance role."
  type        = list(string)
  default     = []
}

variable "ami_id" {
  description = "The image: Amazon Linux 2023, or for GPU pools an AL2023 image with the NVIDIA driver, docker and the NVIDIA container toolkit."
  type        = string
}

variable "volume_gb" {
  description = "Root volume size: images, jobs' work directories, the dataset cache."
  type        = number
}

variable "security_group_id" {
  description = "The runner security group."
  type        = string
}

variable "kms_key_arn" {
  description = "The kiln key (volumes, S3 objects, the database secret)."
  type        = string
}

variable "bucket" {
  description = "The kiln bucket's name."
  type        = string
}

variable "bucket_arn" {
  description = "The kiln bucket's ARN."
  type        = string
}

variable "objects_prefix" {
  description = "The prefix of kiln's blobs in the bucket."
  type        = string
}

variable "release_prefix" {
  description = "The prefix of the kiln release's binaries in the bucket."
  type        = string
}

variable "nats_urls" {
  description = "NATS client URLs, comma-separated."
  type        = string
}

variable "nats_seed_prefix" {
  description = "The SSM Parameter Store path under which each service's NATS NKey seed is; the runners read <prefix>/runner."
  type        = string
}

variable "nats_seed_arn_prefix" {
  description = "The ARN of that path (arn:aws:ssm:REGION:ACCOUNT:parameter<prefix>), for the instance role."
  type        = string
}

variable "nats_replicas" {
  description = "Replicas of kiln's streams and buckets."
  type        = number
}

variable "database" {
  description = "Where Postgres is, and the secret that holds its master password."
  type = object({
    host       = string
    port       = number
    name       = string
    secret_arn = string
  })
}

variable "api_url" {
  description = "The api's address, given to jobs as KILN_API."
  type        = string
}

variable "logs_url" {
  description = "log-ingest's address, given to jobs as KILN_LOGS."
  type        = string
}

variable "job_endpoints" {
  description = "More host:port endpoints jobs may reach besides api_url and logs_url: item-batch's name (every replica's address)."
  type        = list(string)
  default     = []
}
