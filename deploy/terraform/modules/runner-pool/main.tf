# One kiln runner pool: an Auto Scaling group of instances, each running kiln-runner with the
# docker provider, mixing on-demand (a settable base) and spot (price-capacity-optimized) over the
# pool's instance types, from 0 instances up.
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
    })
  })
}

module "role" {
  source      = "../instance-role"
  name        = "${var.name}-runner-${var.pool}"
  policy_json = data.aws_iam_policy_document.runner.json
}

resource "aws_launch_template" "this" {
  name_prefix            = "${var.name}-runner-${var.pool}-"
  image_id               = var.ami_id
  user_data              = base64encode(local.user_data)
  vpc_security_group_ids = [var.security_group_id]
  ebs_optimized          = true
  update_default_version = true

  iam_instance_profile {
    name = module.role.profile_name
  }

  # IMDSv2 only, and a hop limit of 1: kiln-runner on the host reaches the metadata service, the
  # jobs' containers (one hop further, behind docker's bridge) do not, so a job cannot take the
  # runner's credentials. Nothing in a container needs them: jobs get their inputs from kiln.
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

  tag_specifications {
    resource_type = "instance"
    tags          = { Name = "${var.name}-runner-${var.pool}", "kiln:pool" = var.pool }
  }

  tag_specifications {
    resource_type = "volume"
    tags          = { Name = "${var.name}-runner-${var.pool}", "kiln:pool" = var.pool }
  }
}

resource "aws_autoscaling_group" "this" {
  name_prefix         = "${var.name}-runner-${var.pool}-"
  vpc_zone_identifier = var.subnet_ids
  min_size            = var.min_size
  max_size            = var.max_size
  desired_capacity    = var.desired_capacity
  # A spot instance about to be reclaimed is replaced before it goes.
  capacity_rebalance        = true
  health_check_type         = "EC2"
  health_check_grace_period = 300
  default_instance_warmup   = 300

  mixed_instances_policy {
    instances_distribution {
      on_demand_base_capacity                  = var.on_demand_base_capacity
      on_demand_percentage_above_base_capacity = var.on_demand_percentage_above_base
      on_demand_allocation_strategy            = "prioritized"
      spot_allocation_strategy                 = "price-capacity-optimized"
    }

    launch_template {
      launch_template_specification {
        launch_template_id = aws_launch_template.this.id
        version            = aws_launch_template.this.latest_version
      }

      dynamic "override" {
        for_each = var.instance_types
        content {
          instance_type = override.value
        }
      }
    }
  }

  # A new launch template version (new release, new config) replaces instances gradually.
  instance_refresh {
    strategy = "Rolling"
    preferences {
      min_healthy_percentage = 50
    }
  }

  tag {
    key                 = "Name"
    value               = "${var.name}-runner-${var.pool}"
    propagate_at_launch = true
  }

  tag {
    key                 = "kiln:pool"
    value               = var.pool
    propagate_at_launch = true
  }

  lifecycle {
    # The pool's size is set by whoever scales it, not by every apply.
    ignore_changes = [desired_capacity]
  }
}
