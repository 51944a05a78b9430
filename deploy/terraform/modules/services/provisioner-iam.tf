# What kiln-provisioner may do in EC2, on top of what every service may (iam.tf), and what no
# other role may: launch runner instances, tag them as they are made, terminate them
# (docs/provisioner.md section 13). Every write is held to the cluster's tag:
#   launch (CreateFleet, RunInstances): the instances, volumes, network interfaces and fleets
#       it makes must carry kiln-cluster = CLUSTER in the request; they may come only from the
#       pools' launch templates, into the private subnets, with the runner security group and
#       the pools' images, and into no placement group but the pools' own (cluster_placement:
#       a pool's gangs launch into its cluster placement group NAME-runner-POOL, whose ARN
#       ends in the group's name, placement-group/NAME, not its id); modules/provisioner-launch
#       makes that list of ARNs without a provider, so tests/render checks it offline;
#   tag: only inside those create calls (ec2:CreateAction), never an existing resource;
#   terminate: only instances tagged kiln-cluster = CLUSTER;
#   pass: the runner pools' roles only, to EC2 only;
#   the spot service-linked role, created on the first spot launch of an account that never
#       had one.
# Describe* is read-only and cannot be narrowed by resource. The volumes' KMS key lets any
# principal of the account use it through EC2 (modules/kms), as AWS's own aws/ebs key does: the
# provisioner is the only kiln role that may create volumes.
data "aws_caller_identity" "current" {}
data "aws_partition" "current" {}

locals {
  ec2_arn = "arn:${data.aws_partition.current.partition}:ec2:${var.region}"
  account = data.aws_caller_identity.current.account_id
}

module "provisioner_launch" {
  source     = "../provisioner-launch"
  partition  = data.aws_partition.current.partition
  region     = var.region
  account_id = local.account
  launch     = var.provisioner_launch
}

data "aws_iam_policy_document" "provisioner" {
  #checkov:skip=CKV_AWS_356: the one statement with resource "*" is ec2:Describe* (read-only; docs/provisioner.md section 13), every write is held to ARNs and the cluster's tag
  statement {
    sid     = "LaunchTaggedForTheCluster"
    actions = ["ec2:CreateFleet", "ec2:RunInstances"]
    resources = [
      "${local.ec2_arn}:${local.account}:instance/*",
      "${local.ec2_arn}:${local.account}:volume/*",
      "${local.ec2_arn}:${local.account}:network-interface/*",
      "${local.ec2_arn}:${local.account}:fleet/*",
    ]
    condition {
      test     = "StringEquals"
      variable = "aws:RequestTag/kiln-cluster"
      values   = [var.cluster]
    }
  }

  # The pools' launch templates, the private subnets, the runner security group, the pools'
  # images and their snapshots, spot requests, the pools' cluster placement groups (by name).
  statement {
    sid       = "LaunchFromThePools"
    actions   = ["ec2:CreateFleet", "ec2:RunInstances"]
    resources = module.provisioner_launch.resources
  }

  statement {
    sid     = "TagOnlyWhileCreating"
    actions = ["ec2:CreateTags"]
    resources = [
      "${local.ec2_arn}:${local.account}:instance/*",
      "${local.ec2_arn}:${local.account}:volume/*",
      "${local.ec2_arn}:${local.account}:network-interface/*",
      "${local.ec2_arn}:${local.account}:fleet/*",
    ]
    condition {
      test     = "StringEquals"
      variable = "ec2:CreateAction"
      values   = ["CreateFleet", "RunInstances"]
    }
    condition {
      test     = "StringEquals"
      variable = "aws:RequestTag/kiln-cluster"
      values   = [var.cluster]
    }
  }

  statement {
    sid       = "TerminateTheClustersInstances"
    actions   = ["ec2:TerminateInstances"]
    resources = ["${local.ec2_arn}:${local.account}:instance/*"]
    condition {
      test     = "StringEquals"
      variable = "ec2:ResourceTag/kiln-cluster"
      values   = [var.cluster]
    }
  }

  statement {
    sid       = "Describe"
    actions   = ["ec2:Describe*"]
    resources = ["*"]
  }

  statement {
    sid       = "PassTheRunnersRoles"
    actions   = ["iam:PassRole"]
    resources = var.provisioner_launch.runner_role_arns
    condition {
      test     = "StringEquals"
      variable = "iam:PassedToService"
      values   = ["ec2.amazonaws.com"]
    }
  }

  statement {
    sid       = "SpotServiceLinkedRole"
    actions   = ["iam:CreateServiceLinkedRole"]
    resources = ["arn:${data.aws_partition.current.partition}:iam::${local.account}:role/aws-service-role/spot.amazonaws.com/AWSServiceRoleForEC2Spot"]
    condition {
      test     = "StringEquals"
      variable = "iam:AWSServiceName"
      values   = ["spot.amazonaws.com"]
    }
  }
}
