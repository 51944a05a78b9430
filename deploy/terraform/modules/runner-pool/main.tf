# One kiln runner pool: the launch template kiln-provisioner launches the pool's instances from
# (CreateFleet, its $Default version), each running kiln-runner with the docker provider, the
# runners' role, and (cluster_placement) a cluster placement group for the pool's gangs. No Auto
# Scaling group: the provisioner chooses instance types, zones, spot or on-demand and how many,
# from the jobs waiting (docs/provisioner.md); terraform only says what an instance is.
locals {
  objects_url = "s3://${var.bucket}/${var.objects_prefix}"
  user_data = templatefile("${path.module}/../../templates/kiln-service.sh.tftpl", {
    service              = "runner"
    unit                 = "kiln-runner"
    binaries             = ["kiln-runner", "kiln-agent"]
    env_prefix           = "KILN_RUNNER"
    region               = var.region
    bucket               = var.bucket
    release_prefix       = var.release_prefix
    secret_arn           = var.database.secret_arn
    db_host              = var.database.host
    db_port              = var.database.port
    db_name              = var.database.name
    nats_seed_parameter  = "${var.nats_seed_prefix}/runner"
    after                = " docker.service kiln-imds-block.service"
    supplementary_groups = ["docker"]
    # iptables for the jobs' firewall (docs/security/network.md), nothing else of root's.
    ambient_capabilities = "CAP_NET_ADMIN CAP_NET_RAW"
    setup                = templatefile("${path.module}/setup.sh.tftpl", { gpu = var.gpu })
    config = templatefile("${path.module}/runner.toml.tftpl", {
      pool          = var.pool
      api_url       = var.api_url
      logs_url      = var.logs_url
      job_endpoints = var.job_endpoints
      nats_urls     = var.nats_urls
      nats_replicas = var.nats_replicas
      objects_url   = local.objects_url
      region        = var.region
      # The registry hosts of those repositories: ACCOUNT.dkr.ecr.REGION.amazonaws.com.
      ecr_registries = distinct([
        for arn in var.ecr_repositories : "${split(":", arn)[4]}.dkr.ecr.${split(":", arn)[3]}.amazonaws.com"
      ])
    })
  })
}

module "role" {
  source      = "../instance-role"
  name        = "${var.name}-runner-${var.pool}"
  policy_json = data.aws_iam_policy_document.runner.json
}

# Named, not name-prefixed: the provisioner's config names it (`launch-template`), and its
# $Default version follows every apply, so a new release or config reaches the next instance the
# provisioner launches (running ones keep theirs until they idle out or are replaced).
resource "aws_launch_template" "this" {
  name                   = var.launch_template_name
  description            = "kiln runner pool ${var.pool} of cluster ${var.cluster}: launched by kiln-provisioner"
  image_id               = var.ami_id
  user_data              = base64encode(local.user_data)
  vpc_security_group_ids = [var.security_group_id]
  ebs_optimized          = true
  update_default_version = true

  iam_instance_profile {
    name = module.role.profile_name
  }

  # IMDSv2 only, and a hop limit of 1: kiln-runner on the host reaches the metadata service (its
  # [imds] poller reads the instance's identity and spot notices there), the jobs' containers
  # (one hop further, behind docker's bridge) do not, so a job cannot take the runner's
  # credentials. Nothing in a container needs them: jobs get their inputs from kiln.
  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 1
    instance_metadata_tags      = "disabled"
  }

  monitoring {
    enabled = true
  }

  block_device_mappings {
    device_name = "/dev/xvda"
    ebs {
      volume_type           = "gp3"
      volume_size           = var.volume_gb
      encrypted             = true
      kms_key_id            = var.kms_key_arn
      delete_on_termination = true
    }
  }

  # kiln-cluster is deliberately not here: the provisioner puts kiln-cluster, kiln-pool and
  # kiln-intent into each create call's own TagSpecifications, which is what its IAM conditions
  # read (aws:RequestTag) and what its reaper lists by. An instance someone launches from this
  # template by hand is then not the provisioner's to terminate.
  tag_specifications {
    resource_type = "instance"
    tags          = { Name = "${var.name}-runner-${var.pool}", "kiln-pool" = var.pool }
  }

  tag_specifications {
    resource_type = "volume"
    tags          = { Name = "${var.name}-runner-${var.pool}", "kiln-pool" = var.pool }
  }

  tags = { Name = var.launch_template_name, "kiln-cluster" = var.cluster, "kiln-pool" = var.pool }
}

# The pool's gangs (multi-node jobs) launch into it: the provisioner names it (`placement-group`)
# in each gang's CreateFleet, whose instances are all of one zone. Not in the launch template:
# the pool's other launches (single nodes, any zone of the pool) stay out of it. Named like the
# launch template (the provisioner's role may launch into it by that name).
resource "aws_placement_group" "gangs" {
  count    = var.cluster_placement ? 1 : 0
  name     = var.launch_template_name
  strategy = "cluster"
  tags     = { Name = var.launch_template_name, "kiln-cluster" = var.cluster, "kiln-pool" = var.pool }
}
